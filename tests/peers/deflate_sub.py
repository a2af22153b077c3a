#!/usr/bin/env python3
"""permessage-deflate peer for throng serve (Python `websockets`, which
offers the extension by default and compresses what it sends).

usage: deflate_sub.py ws://HOST:PORT COUNT CHANNEL

Opens /?channel=warmup with throng.v1, prints {"extensions": <the answer's
Sec-WebSocket-Extensions>}, subscribes to CHANNEL in-band (a compressed
frame), prints "ready" once answered, then one JSON line per message
({"hex": ...} of the text frame), then closes and prints {"closed": code}.
Gives up after 30 s.
"""
import asyncio
import json
import sys

import websockets


async def main(base: str, count: int, channel: str) -> None:
    async with websockets.connect(
        base + "/?channel=warmup", subprotocols=["throng.v1"], ping_interval=None
    ) as ws:
        ext = ws.response.headers.get("Sec-WebSocket-Extensions")
        print(json.dumps({"extensions": ext}), flush=True)
        # Padded past any threshold, so the library surely compresses it.
        await ws.send(json.dumps({"subscribe": channel}) + " " * 300)
        answer = await ws.recv()
        if json.loads(answer) != {"subscribed": channel}:
            raise SystemExit(f"subscribe answered {answer}")
        print("ready", flush=True)
        for _ in range(count):
            msg = await ws.recv()
            data = msg if isinstance(msg, bytes) else msg.encode("utf-8")
            print(json.dumps({"hex": data.hex()}), flush=True)
        await ws.close(code=1000, reason="done")
        print(json.dumps({"closed": ws.close_code}), flush=True)


if __name__ == "__main__":
    asyncio.run(asyncio.wait_for(main(sys.argv[1], int(sys.argv[2]), sys.argv[3]), 30))
