#!/usr/bin/env python3
"""An independent push server for `throng hold` tests, on Python `websockets`.

Subscribers connect with WebSocket to /<channel>; a message POSTed to
http://127.0.0.1:<http port>/publish/<channel> is sent to every subscriber of
that channel, answered with {"subscribers": N}. Misbehaviour on request, so
tests can check hold's error counts:

  --refuse-every K   answer every K-th upgrade with HTTP 503 (bad status)
  --close-every K    close every K-th connection right after the handshake
                     with --close-code (default 4000)
  --ports N          listen for WebSocket on N ports (consecutive when free)
  --tls-cert FILE --tls-key FILE
                     serve wss:// (TLS, Python's ssl module) with this PEM
                     certificate chain and key; publishing stays plain HTTP

On start it prints one line `READY <ws_first_port> <ws_last_port> <http_port>`
and then serves until stdin closes or it is killed. A line `stats` on stdin
prints one JSON line: upgrades seen, connections opened by client address
and by server port.
"""

import argparse
import asyncio
import json
import resource
import socket
import ssl
import sys

import websockets
from websockets.asyncio.server import serve, broadcast
from websockets.http11 import Response
from websockets.datastructures import Headers

subscribers = {}
counter = {"upgrades": 0, "opened": 0}
by_ip = {}
by_port = {}


def raise_open_file_limit():
    """Lifts the soft open-file limit to the hard one: a shell's default soft
    limit of 1024 is less than the connections the tests hold."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def free_consecutive_ports(n):
    """Finds n consecutive free ports on 127.0.0.1 (bind-probe, then release)."""
    for _ in range(200):
        probe = socket.socket()
        probe.bind(("127.0.0.1", 0))
        first = probe.getsockname()[1]
        probe.close()
        if first + n > 65535:
            continue
        socks = []
        ok = True
        for p in range(first, first + n):
            s = socket.socket()
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("127.0.0.1", p))
                socks.append(s)
            except OSError:
                ok = False
                break
        for s in socks:
            s.close()
        if ok:
            return first
    raise SystemExit("no free consecutive ports")


async def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ports", type=int, default=1)
    ap.add_argument("--refuse-every", type=int, default=0)
    ap.add_argument("--close-every", type=int, default=0)
    ap.add_argument("--close-code", type=int, default=4000)
    ap.add_argument("--tls-cert")
    ap.add_argument("--tls-key")
    args = ap.parse_args()
    tls = None
    if args.tls_cert:
        tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        tls.load_cert_chain(args.tls_cert, args.tls_key)

    def process_request(connection, request):
        counter["upgrades"] += 1
        if args.refuse_every and counter["upgrades"] % args.refuse_every == 0:
            return Response(503, "Service Unavailable", Headers([("Content-Length", "0")]), b"")
        return None

    async def handler(ws):
        channel = ws.request.path.lstrip("/").split("?")[0]
        counter["opened"] += 1
        ip = ws.remote_address[0]
        port = ws.local_address[1]
        by_ip[ip] = by_ip.get(ip, 0) + 1
        by_port[port] = by_port.get(port, 0) + 1
        if args.close_every and counter["opened"] % args.close_every == 0:
            await ws.close(args.close_code, "test peer closes this one")
            return
        subs = subscribers.setdefault(channel, set())
        subs.add(ws)
        try:
            await ws.wait_closed()
        finally:
            subs.discard(ws)

    async def http_client(reader, writer):
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, target, _ = lines[0].split(" ", 2)
                length = 0
                for line in lines[1:]:
                    if line.lower().startswith("content-length:"):
                        length = int(line.split(":", 1)[1])
                body = await reader.readexactly(length) if length else b""
                if method == "POST" and target.startswith("/publish/"):
                    channel = target[len("/publish/"):]
                    subs = list(subscribers.get(channel, ()))
                    broadcast(subs, body.decode("utf-8"))
                    out = json.dumps({"subscribers": len(subs)}).encode()
                    status = "200 OK"
                else:
                    out = b"not found"
                    status = "404 Not Found"
                writer.write(
                    f"HTTP/1.1 {status}\r\nContent-Length: {len(out)}\r\nContent-Type: application/json\r\n\r\n".encode()
                    + out
                )
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    first = free_consecutive_ports(args.ports)
    servers = []
    for port in range(first, first + args.ports):
        servers.append(
            await serve(
                handler,
                "127.0.0.1",
                port,
                process_request=process_request,
                ping_interval=None,
                max_queue=None,
                backlog=4096,
                compression=None,
                ssl=tls,
            )
        )
    http_server = await asyncio.start_server(http_client, "127.0.0.1", 0)
    http_port = http_server.sockets[0].getsockname()[1]
    print(f"READY {first} {first + args.ports - 1} {http_port}", flush=True)

    loop = asyncio.get_running_loop()
    while True:
        line = await loop.run_in_executor(None, sys.stdin.readline)
        if not line:
            break
        if line.strip() == "stats":
            print(json.dumps({"upgrades": counter["upgrades"], "opened": counter["opened"],
                              "by_ip": by_ip, "by_port": {str(k): v for k, v in by_port.items()}}), flush=True)


if __name__ == "__main__":
    raise_open_file_limit()
    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        pass
