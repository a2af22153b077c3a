#!/usr/bin/env python3
"""The clients of scripts/bench-cluster.sh: WebSocket subscribers of many
channels spread over several throng nodes, a burst publisher that sends one
message to every channel, and a paced publisher for the failover timeline.
Every loop is bounded; everything talks to 127.0.0.1 only.

  subscribe PORTS CHANNELS ROUNDS   hold one subscriber per channel (channel
                                    c<i> on node i % len(PORTS)); print
                                    "ready", then per burst round one JSON
                                    line: how many arrived, the last arrival
  burst PORTS CHANNELS ROUND        POST one message to every channel, spread
                                    over the nodes; print one JSON line
  paced PORT CHANNELS SECONDS KILL_PID KILL_AT
                                    POST every 10 ms round the channels,
                                    SIGKILL KILL_PID at KILL_AT s; print the
                                    timeline as one JSON line
"""

import asyncio
import json
import os
import signal
import sys
import time

import websockets.asyncio.client as wsc
from websockets.exceptions import ConnectionClosed

HOST = "127.0.0.1"


async def subscribe(ports, channels, rounds):
    got = {}  # round -> [count, last arrival ns]
    sem = asyncio.Semaphore(200)
    conns = []

    async def open_one(i):
        port = ports[i % len(ports)]
        async with sem:
            for _ in range(20):
                try:
                    c = await wsc.connect(f"ws://{HOST}:{port}/c{i}", max_size=None,
                                          ping_interval=None, open_timeout=30)
                    conns.append(c)
                    return c
                except OSError:
                    await asyncio.sleep(0.2)
        raise SystemExit(f"could not subscribe c{i}")

    async def read(c):
        try:
            async for m in c:
                now = time.time_ns()
                if isinstance(m, bytes):
                    m = m.decode(errors="replace")
                if m.startswith("b"):
                    r = int(m[1:].split(" ", 1)[0])
                    g = got.setdefault(r, [0, 0])
                    g[0] += 1
                    g[1] = max(g[1], now)
        except (ConnectionClosed, OSError):
            pass

    opened = await asyncio.gather(*(open_one(i) for i in range(channels)))
    readers = [asyncio.create_task(read(c)) for c in opened]
    print("ready", flush=True)
    deadline = time.monotonic() + 600
    for r in range(rounds):
        # A round ends when every channel got it, or 20 s after its first.
        while time.monotonic() < deadline:
            g = got.get(r)
            if g and (g[0] >= channels or time.time_ns() - g[1] > 20e9):
                break
            await asyncio.sleep(0.05)
        g = got.get(r, [0, 0])
        print(json.dumps({"round": r, "got": g[0], "last_ns": g[1]}), flush=True)
    for t in readers:
        t.cancel()
    for c in opened:
        await c.close()


async def post(reader, writer, path, body):
    req = (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n"
           ).encode() + body
    writer.write(req)
    await writer.drain()
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    await reader.readexactly(length)
    return status


async def burst(ports, channels, rnd):
    per_conn = 8
    todo = list(range(channels))
    ok = failed = 0
    start = time.time_ns()

    async def lane(port, items):
        nonlocal ok, failed
        reader, writer = await asyncio.open_connection(HOST, port)
        for i in items:
            s = await post(reader, writer, f"/publish/c{i}",
                           f"b{rnd} {time.time_ns()}".encode())
            if s == 200:
                ok += 1
            else:
                failed += 1
        writer.close()

    lanes = []
    for k, port in enumerate(ports):
        mine = todo[k::len(ports)]
        for j in range(per_conn):
            lanes.append(lane(port, mine[j::per_conn]))
    await asyncio.wait_for(asyncio.gather(*lanes), 120)
    end = time.time_ns()
    print(json.dumps({"round": rnd, "start_ns": start, "end_ns": end, "ok": ok,
                      "failed": failed}), flush=True)


async def paced(port, channels, seconds, kill_pid, kill_at):
    reader, writer = await asyncio.open_connection(HOST, port)
    t0 = time.monotonic()
    killed = None
    events = []  # (t, channel index, status)
    i = 0
    while time.monotonic() - t0 < seconds:
        t = time.monotonic() - t0
        if killed is None and t >= kill_at:
            os.kill(kill_pid, signal.SIGKILL)
            killed = t
        ch = i % channels
        s = await post(reader, writer, f"/publish/c{ch}", f"p{i}".encode())
        events.append((t, ch, s))
        i += 1
        await asyncio.sleep(0.01)
    writer.close()
    refused = [e for e in events if e[2] != 200]
    after = [e for e in events if killed is not None and e[0] > killed]
    failed_chs = {e[1] for e in refused}
    out = {
        "killed_at": killed,
        "published": len(events),
        "acknowledged": len(events) - len(refused),
        "refused": len(refused),
        "channels_refused": len(failed_chs),
        "channels": channels,
        "first_refused": refused[0][0] if refused else None,
        "last_refused": refused[-1][0] if refused else None,
        "acknowledged_after_kill": sum(1 for e in after if e[2] == 200),
    }
    print(json.dumps(out), flush=True)


def main():
    what = sys.argv[1]
    ports = [int(p) for p in sys.argv[2].split(",")]
    if what == "subscribe":
        asyncio.run(subscribe(ports, int(sys.argv[3]), int(sys.argv[4])))
    elif what == "burst":
        asyncio.run(burst(ports, int(sys.argv[3]), int(sys.argv[4])))
    elif what == "paced":
        asyncio.run(paced(ports[0], int(sys.argv[3]), float(sys.argv[4]),
                          int(sys.argv[5]), float(sys.argv[6])))
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main()
