#!/usr/bin/env python3
"""A JSON Web Key Set server for `throng serve --auth-jwks-url` tests: Python's
own http.server and ssl (an HTTPS implementation independent of throng's rustls).

usage: python3 jwks_server.py --tls-cert FILE --tls-key FILE SET_FILE

Every GET answers 200 with SET_FILE's content as it is at that moment (a test
rotates keys by rewriting the file), chunked (Transfer-Encoding: chunked, as
many providers answer). On start it prints one line `READY <port>` (it listens
on 127.0.0.1, a port the kernel picks). A line `gets` on stdin prints the
number of GETs served so far; it serves until stdin closes or it is killed.
"""

import argparse
import http.server
import ssl
import sys
import threading

gets = 0
lock = threading.Lock()


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self):
        global gets
        with lock:
            gets += 1
        with open(self.server.set_file, "rb") as f:
            body = f.read()
        self.send_response(200)
        self.send_header("Content-Type", "application/jwk-set+json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        # Two chunks, so a reader must join them.
        half = len(body) // 2
        for part in (body[:half], body[half:]):
            if part:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(part), part))
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def log_message(self, *args):
        pass


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tls-cert", required=True)
    ap.add_argument("--tls-key", required=True)
    ap.add_argument("set_file")
    args = ap.parse_args()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.set_file = args.set_file
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(args.tls_cert, args.tls_key)
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    print("READY", server.server_address[1], flush=True)
    for line in sys.stdin:
        if line.strip() == "gets":
            with lock:
                print(gets, flush=True)
    server.shutdown()


if __name__ == "__main__":
    main()
