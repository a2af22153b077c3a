#!/usr/bin/env python3
"""A client of several channels on one connection for throng serve's test
(Python `websockets`, which offers permessage-deflate: the server declines).

usage: channels_client.py ws://HOST:PORT/?channel=a&channel=b

Connects offering the throng.v1 subprotocol, prints
{"protocol": <the one chosen>}, then sends each line read from stdin as a
text frame, and prints each frame received, as it arrives, as
{"frame": <text>}. Closes cleanly at EOF and prints {"closed": <code>}.
Gives up after 30 s.
"""
import asyncio
import json
import sys

import websockets


async def main(url: str) -> None:
    async with websockets.connect(
        url, subprotocols=["throng.v1"], ping_interval=None
    ) as ws:
        print(json.dumps({"protocol": ws.subprotocol}), flush=True)

        async def receive() -> None:
            async for msg in ws:
                text = msg if isinstance(msg, str) else msg.decode("utf-8", "replace")
                print(json.dumps({"frame": text}), flush=True)

        reader = asyncio.ensure_future(receive())
        loop = asyncio.get_running_loop()
        while True:
            line = await loop.run_in_executor(None, sys.stdin.readline)
            if not line:
                break
            await ws.send(line.strip())
        reader.cancel()
        await ws.close(code=1000, reason="done")
        print(json.dumps({"closed": ws.close_code}), flush=True)


if __name__ == "__main__":
    asyncio.run(asyncio.wait_for(main(sys.argv[1]), 30))
