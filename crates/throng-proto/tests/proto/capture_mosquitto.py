#!/usr/bin/env python3
"""Records what MQTT clients and a broker say to each other, for the codec's
interop tests (mqtt_interop.rs), which replay the bytes without a broker.

Relays a local port to a broker and prints every chunk, per connection and
direction (`c1>` client to broker, `c1<` broker to client), as hex:

    mosquitto -p 18830 &
    python3 capture_mosquitto.py 18831 18830 > capture.log &
    mosquitto_sub -p 18831 -V mqttv5 -i sub5 -q 1 -t 'sensors/#' -C 2 &
    mosquitto_pub -p 18831 -V mqttv5 -i pub5 -q 1 -t sensors/2/temp -m 'hi 5'

Stop it (and the broker) by pid when done.
"""
import socket
import sys
import threading


def pump(src, dst, tag):
    while True:
        data = src.recv(65536)
        if not data:
            try:
                dst.shutdown(socket.SHUT_WR)
            except OSError:
                pass
            return
        print(tag, data.hex(), flush=True)
        dst.sendall(data)


def main():
    listen, upstream = int(sys.argv[1]), int(sys.argv[2])
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.1", listen))
    server.listen()
    n = 0
    while True:
        client, _ = server.accept()
        n += 1
        broker = socket.create_connection(("127.0.0.1", upstream))
        for a, b, tag in ((client, broker, f"c{n}>"), (broker, client, f"c{n}<")):
            threading.Thread(target=pump, args=(a, b, tag), daemon=True).start()


if __name__ == "__main__":
    main()
