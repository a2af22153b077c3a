"""A server that pushes to every client on its own, as the C1000K servers
push the time: the root path, a JSON message {"t": <unix us>, "seq": n}
every --every seconds to each connection. With --need-header NAME:VALUE it
refuses an upgrade without that header (401); with --subprotocol it
speaks that one. Prints "ready <port>" once listening; serves until killed
or --timeout seconds."""

import argparse
import asyncio
import json
import time
from http import HTTPStatus

from websockets.asyncio.server import serve


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--every", type=float, default=0.2)
    p.add_argument("--need-header", default=None)
    p.add_argument("--subprotocol", default=None)
    p.add_argument("--timeout", type=float, default=60)
    p.add_argument("--skip-every", type=int, default=0,
                   help="skip one sequence number after every N messages")
    args = p.parse_args()
    asyncio.run(run(args))


async def run(args):
    async def check(connection, request):
        if request.path != "/":
            return connection.respond(HTTPStatus.NOT_FOUND, "only /\n")
        if args.need_header:
            name, value = args.need_header.split(":", 1)
            if request.headers.get(name.strip()) != value.strip():
                return connection.respond(HTTPStatus.UNAUTHORIZED, "no token\n")
        return None

    async def push(ws):
        seq = 0
        try:
            while True:
                seq += 1
                if args.skip_every and seq % (args.skip_every + 1) == 0:
                    seq += 1
                stamp = time.time_ns() // 1000
                await ws.send(json.dumps({"t": stamp, "seq": seq}))
                await asyncio.sleep(args.every)
        except Exception:
            return

    subprotocols = [args.subprotocol] if args.subprotocol else None
    async with serve(push, "127.0.0.1", 0, process_request=check,
                     subprotocols=subprotocols) as server:
        port = server.sockets[0].getsockname()[1]
        print(f"ready {port}", flush=True)
        await asyncio.sleep(args.timeout)


if __name__ == "__main__":
    main()
