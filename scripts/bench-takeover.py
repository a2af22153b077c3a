#!/usr/bin/env python3
"""The takeover measurement (run by scripts/bench-takeover.sh): N throng.v1
subscribers on a `serve --redis --history`, a steady publisher, a client
connecting in a loop, then `serve --takeover`. Prints refused connections,
messages lost after rejoining with ?since=, the reconnect rate over time and
how long the old process lived on. Everything is bounded by --limit."""

import argparse, asyncio, base64, os, resource, subprocess, sys, time


async def upgrade(host, port, path):
    r, w = await asyncio.open_connection(host, port)
    key = base64.b64encode(os.urandom(16)).decode()
    w.write((f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\n"
             f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
             f"Sec-WebSocket-Protocol: throng.v1\r\n\r\n").encode())
    head = await r.readuntil(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 101"):
        raise OSError(head.split(b"\r\n")[0].decode())
    return r, w


async def frames(r):
    """Yields (opcode, payload) of the server's (unmasked) frames."""
    while True:
        b0, b1 = await r.readexactly(2)
        n = b1 & 0x7F
        if n == 126:
            n = int.from_bytes(await r.readexactly(2), "big")
        elif n == 127:
            n = int.from_bytes(await r.readexactly(8), "big")
        yield b0 & 0x0F, await r.readexactly(n)


class Run:
    def __init__(self, a):
        self.a, self.got, self.closes, self.rejoins = a, {}, {}, []
        self.refused = self.probes = self.rejoin_failed = 0
        self.sent = -1
        self.connected = 0
        self.why = {}


    async def subscriber(self, i):
        since, seen = None, set()
        self.got[i] = seen
        while True:
            path = "/feed" + (f"?since={since}" if since else "")
            try:
                r, w = await upgrade(self.a.host, self.a.port, path)
            except (OSError, asyncio.IncompleteReadError) as e:
                self.rejoin_failed += 1
                why = str(e)[:60]
                self.why[why] = self.why.get(why, 0) + 1
                await asyncio.sleep(0.2)
                continue
            if since:
                self.rejoins.append(time.monotonic())
            elif not seen:
                self.connected += 1
            try:
                async for op, data in frames(r):
                    if op == 1:
                        head, _, body = data.partition(b"\n")
                        since = head.decode()
                        seen.add(int(body))
                    elif op == 8:
                        code = int.from_bytes(data[:2], "big") if len(data) >= 2 else None
                        self.closes[code] = self.closes.get(code, 0) + 1
                        break
            except (OSError, asyncio.IncompleteReadError):
                pass
            w.close()



def side(a, sent, probes, refused, stop):
    """The publisher and the prober, in a process of their own so that the
    subscribers' event loop does not slow them down."""
    import socket, threading

    def publisher():
        n = 0
        while not stop.value:
            body = str(n).encode()
            try:
                with socket.create_connection((a.host, a.port), timeout=5) as c:
                    c.sendall(b"POST /publish/feed HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                              b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
                    if b" 200 " in c.recv(64):
                        sent.value = n
                        n += 1
            except OSError:
                pass
            time.sleep(1 / a.pub_rate)

    def prober():
        while not stop.value:
            probes.value += 1
            try:
                with socket.create_connection((a.host, a.port), timeout=5) as c:
                    c.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                    if not c.recv(64).startswith(b"HTTP/1.1"):
                        refused.value += 1
            except OSError:
                refused.value += 1
            time.sleep(0.005)

    ts = [threading.Thread(target=publisher), threading.Thread(target=prober)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()


async def main(a):
    run = Run(a)
    logs = os.environ.get("LOGDIR", "/tmp")
    old = subprocess.Popen(a.old.split(), stdout=subprocess.DEVNULL,
                           stderr=open(f"{logs}/bench-takeover-old.log", "w"))
    await asyncio.sleep(2)
    t0 = time.monotonic()
    subs = []
    for i in range(a.n):
        subs.append(asyncio.create_task(run.subscriber(i)))
        if i % 500 == 499:
            await asyncio.sleep(0.25)
    while run.connected < a.n and time.monotonic() - t0 < a.limit:
        await asyncio.sleep(0.1)
    import multiprocessing as mp
    sent, probes, refused, stop = (mp.Value("q", -1), mp.Value("q", 0), mp.Value("q", 0),
                                   mp.Value("b", 0))
    helper = mp.Process(target=side, args=(a, sent, probes, refused, stop))
    helper.start()
    await asyncio.sleep(3)
    print(f"subscribers: {a.n} opened in {time.monotonic() - t0:.1f} s", flush=True)
    t1 = time.monotonic()
    new = subprocess.Popen(a.new.split(), stdout=subprocess.DEVNULL,
                           stderr=open(f"{logs}/bench-takeover-new.log", "w"))
    while old.poll() is None and time.monotonic() - t1 < a.limit:
        await asyncio.sleep(0.05)
    old_gone = time.monotonic() - t1
    await asyncio.sleep(2)
    stop.value = 1
    helper.join(timeout=10)
    run.sent, run.probes, run.refused = sent.value, probes.value, refused.value
    # The last messages' way to every subscriber.
    await asyncio.sleep(3)
    for t in subs:
        t.cancel()
    lost = sum(len(set(range(run.sent + 1)) - s) for s in run.got.values())
    print(f"refused or reset connections: {run.refused} of {run.probes} probes; "
          f"failed rejoins (retried): {run.rejoin_failed}")
    print(f"messages published: {run.sent + 1}; lost after ?since= rejoin: {lost} "
          f"(over {len(run.got)} subscribers)")
    print(f"close codes: {run.closes}")
    if run.why:
        print(f"why rejoins failed: {sorted(run.why.items(), key=lambda x: -x[1])[:3]}")
    print(f"old process gone {old_gone:.1f} s after the takeover started"
          + ("" if old.poll() is not None else " (STILL RUNNING, killed)"))
    per = {}
    for t in run.rejoins:
        s = int(t - t1)
        per[s] = per.get(s, 0) + 1
    print("rejoins per second after the takeover: "
          + " ".join(f"{s}s:{per[s]}" for s in sorted(per)))
    for p in (old, new):
        if p.poll() is None:
            p.terminate()
    for p in (old, new):
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            p.kill()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--n", type=int, default=10000)
    ap.add_argument("--pub-rate", type=float, default=20)
    ap.add_argument("--limit", type=float, default=60)
    ap.add_argument("--old", required=True)
    ap.add_argument("--new", required=True)
    a = ap.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    asyncio.run(main(a))
