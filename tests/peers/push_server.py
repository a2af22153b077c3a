"""A server that pushes to every client on its own, as the C1000K servers
push the time: the root path, a JSON message {"t": <unix us>, "seq": n}
every --every seconds to each connection. With --need-header NAME:VALUE it
refuses an upgrade without that header (401); with --subprotocol it
speaks that one. With --broadcast N it waits for N clients, then sends one
message to all of them every --every seconds, --gap seconds between one
client and the next (so each message's fan-out spread is at least
(N-1) * gap); --no-seq leaves the "seq" field out. Prints "ready <port>"
once listening; serves until killed or --timeout seconds."""

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
    p.add_argument("--broadcast", type=int, default=0)
    p.add_argument("--gap", type=float, default=0.0)
    p.add_argument("--no-seq", action="store_true")
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

    clients = []
    full = asyncio.Event()

    async def fan_out():
        await full.wait()
        seq = 0
        while True:
            seq += 1
            msg = {"t": time.time_ns() // 1000}
            if not args.no_seq:
                msg["seq"] = seq
            text = json.dumps(msg)
            for i, ws in enumerate(list(clients)):
                if i > 0 and args.gap:
                    await asyncio.sleep(args.gap)
                try:
                    await ws.send(text)
                except Exception:
                    pass
            await asyncio.sleep(args.every)

    async def join(ws):
        clients.append(ws)
        if len(clients) >= args.broadcast:
            full.set()
        try:
            await ws.wait_closed()
        finally:
            clients.remove(ws)

    async def push(ws):
        if args.broadcast:
            return await join(ws)
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
        if args.broadcast:
            asyncio.get_running_loop().create_task(fan_out())
        await asyncio.sleep(args.timeout)


if __name__ == "__main__":
    main()
