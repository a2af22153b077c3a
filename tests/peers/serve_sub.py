#!/usr/bin/env python3
"""Subscriber peer for throng serve's interop test (Python `websockets`).

usage: serve_sub.py ws://HOST:PORT/<channel> COUNT

Prints "ready" once subscribed, then one JSON line per message received
({"binary": bool, "hex": ...}), then closes cleanly and prints
{"closed": <code the server answered with>}. Gives up after 30 s.
"""
import asyncio
import json
import sys

import websockets


async def main(url: str, count: int) -> None:
    async with websockets.connect(url, max_size=None, ping_interval=None) as ws:
        print("ready", flush=True)
        for _ in range(count):
            msg = await ws.recv()
            binary = isinstance(msg, bytes)
            data = msg if binary else msg.encode("utf-8")
            print(json.dumps({"binary": binary, "hex": data.hex()}), flush=True)
        await ws.close(code=1000, reason="done")
        print(json.dumps({"closed": ws.close_code}), flush=True)


if __name__ == "__main__":
    asyncio.run(asyncio.wait_for(main(sys.argv[1], int(sys.argv[2])), 30))
