#!/usr/bin/env python3
"""wss:// subscriber peer for throng serve's TLS test (Python `websockets`
over the standard `ssl` module).

usage: serve_sub_wss.py wss://localhost:PORT/<channel> CAFILE COUNT

Trusts only CAFILE (the server's self-signed certificate). Prints "ready"
once subscribed, then one JSON line per message received
({"binary": bool, "hex": ...}), then closes cleanly and prints
{"closed": <code the server answered with>, "tls": <version>}. Gives up
after 30 s.
"""
import asyncio
import json
import ssl
import sys

import websockets


async def main(url: str, cafile: str, count: int) -> None:
    ctx = ssl.create_default_context(cafile=cafile)
    async with websockets.connect(url, ssl=ctx, max_size=None, ping_interval=None) as ws:
        print("ready", flush=True)
        for _ in range(count):
            msg = await ws.recv()
            binary = isinstance(msg, bytes)
            data = msg if binary else msg.encode("utf-8")
            print(json.dumps({"binary": binary, "hex": data.hex()}), flush=True)
        version = ws.transport.get_extra_info("ssl_object").version()
        await ws.close(code=1000, reason="done")
        print(json.dumps({"closed": ws.close_code, "tls": version}), flush=True)


if __name__ == "__main__":
    asyncio.run(asyncio.wait_for(main(sys.argv[1], sys.argv[2], int(sys.argv[3])), 30))
