"""An HTTP/2 server (h2c, prior knowledge) on python-hyper's `h2`, for the
tests of `throng attack --http2`: an implementation independent of ours
that does, by path, what a front end does now and then.

  /ok       200 "ok"
  /big      200 with a 1 MiB body, sent as the client's windows allow
  /reset    RST_STREAM INTERNAL_ERROR (2)
  /refuse   RST_STREAM REFUSED_STREAM (7): not processed
  /refuse-one-conn  REFUSED_STREAM on the first connection that asks,
            200 on any other
  /goaway3  on the first connection that asks: once three such requests
            are in, the lowest is answered, then GOAWAY with it as the last
            stream, and the connection closes; elsewhere 200

Usage: python3 h2_server.py. Listens on a free port of 127.0.0.1, says
`READY <port>` on stdout; a thread per connection; runs until killed or
its stdin ends.
"""

import os
import socket
import sys
import threading

import h2.config
import h2.connection
import h2.events
import h2.errors
import h2.exceptions

BIG = b"x" * (1 << 20)
goaway_taken = threading.Lock()
goaway_done = [False]
refuser_taken = [False]


def serve(sock):
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False))
    conn.initiate_connection()
    sock.sendall(conn.data_to_send())
    pending = {}  # stream id -> body bytes still to send
    goaway_streams = []
    mine = False  # this connection does the GOAWAY
    refuser = False  # this connection refuses /refuse-one-conn
    while True:
        data = sock.recv(65536)
        if not data:
            return
        for ev in conn.receive_data(data):
            if isinstance(ev, h2.events.RequestReceived):
                path = dict(ev.headers).get(b":path", b"")
                sid = ev.stream_id
                if path == b"/reset":
                    conn.reset_stream(sid, h2.errors.ErrorCodes.INTERNAL_ERROR)
                elif path == b"/refuse":
                    conn.reset_stream(sid, h2.errors.ErrorCodes.REFUSED_STREAM)
                elif path == b"/refuse-one-conn" and (refuser or claim(refuser_taken)):
                    refuser = True
                    conn.reset_stream(sid, h2.errors.ErrorCodes.REFUSED_STREAM)
                elif path == b"/goaway3" and (mine or claim_goaway()):
                    mine = True
                    goaway_streams.append(sid)
                elif path == b"/big":
                    conn.send_headers(sid, [(":status", "200"), ("content-length", str(len(BIG)))])
                    pending[sid] = BIG
                else:
                    conn.send_headers(sid, [(":status", "200"), ("content-length", "2")])
                    conn.send_data(sid, b"ok", end_stream=True)
            elif isinstance(ev, h2.events.DataReceived):
                conn.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
        send_pending(conn, pending)
        if len(goaway_streams) >= 3:
            first = min(goaway_streams)
            conn.send_headers(first, [(":status", "200"), ("content-length", "2")])
            conn.send_data(first, b"ok", end_stream=True)
            conn.close_connection(last_stream_id=first)
            sock.sendall(conn.data_to_send())
            sock.close()
            return
        out = conn.data_to_send()
        if out:
            sock.sendall(out)


def claim_goaway():
    return claim(goaway_done)


def claim(flag):
    """True for the first caller only."""
    with goaway_taken:
        if flag[0]:
            return False
        flag[0] = True
        return True


def send_pending(conn, pending):
    """Sends what the windows allow of each body; the rest waits for WINDOW_UPDATE."""
    for sid in list(pending):
        body = pending[sid]
        while body:
            room = min(conn.local_flow_control_window(sid), conn.max_outbound_frame_size)
            if room <= 0:
                break
            chunk, body = body[:room], body[room:]
            conn.send_data(sid, chunk, end_stream=not body)
        if body:
            pending[sid] = body
        else:
            del pending[sid]


def main():
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen(128)
    print("READY", listener.getsockname()[1], flush=True)
    # The test's end (its stdin closing) ends the server.
    threading.Thread(target=lambda: (sys.stdin.read(), os._exit(0)), daemon=True).start()
    while True:
        sock, _ = listener.accept()
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        threading.Thread(target=run, args=(sock,), daemon=True).start()


def run(sock):
    try:
        serve(sock)
    except (OSError, h2.exceptions.ProtocolError):
        pass
    finally:
        sock.close()


if __name__ == "__main__":
    main()
