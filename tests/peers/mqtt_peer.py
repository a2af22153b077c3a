#!/usr/bin/env python3
"""An MQTT client independent of throng's (paho-mqtt 2), for the tests.

  mqtt_peer.py sub HOST PORT FILTER [--and FILTER]... --qos Q --count N
                 [--timeout S] [--cafile F] [--lines]
      Subscribes to every filter; prints "ready" once SUBACK came (with
      --lines, then one JSON line per message: {"topic", "payload", "qos",
      "retain"}), then, after N messages or the timeout, one JSON line: how
      many came, whether the sequence numbers of throng's "t1 <seq> <ns> ..."
      payloads among them were 1..N in order, and the QoS SUBACK granted.

  mqtt_peer.py pub HOST PORT TOPIC --qos Q --count N --rate R [--cafile F]
      Publishes N timestamped messages in throng's format at R per second,
      each acknowledged at QoS 1; prints one JSON line at the end.

  mqtt_peer.py send HOST PORT TOPIC --qos Q [--retain] [--cafile F]
      Publishes each line of stdin as one message, in order, each
      acknowledged at QoS 1 before the next; prints {"sent", "acked"}.

  Any mode with --ws PATH: MQTT over WebSocket (subprotocol mqtt) to
  ws://HOST:PORT/PATH instead of MQTT over TCP.
"""

import argparse
import json
import ssl
import sys
import threading
import time

import paho.mqtt.client as mqtt


def client(args, name):
    c = mqtt.Client(
        mqtt.CallbackAPIVersion.VERSION2,
        client_id=f"paho-{name}-{time.monotonic_ns()}",
        protocol=mqtt.MQTTv5 if args.v5 else mqtt.MQTTv311,
        transport="websockets" if args.ws else "tcp",
    )
    if args.ws:
        c.ws_set_options(path=args.ws)
    if args.cafile:
        c.tls_set(ca_certs=args.cafile, cert_reqs=ssl.CERT_REQUIRED)
    return c


def sub(args):
    c = client(args, "sub")
    seqs = []
    received = 0
    granted = []
    subscribed = threading.Event()
    done = threading.Event()

    def on_connect(c, _userdata, _flags, reason, _props):
        if reason.is_failure:
            print(json.dumps({"error": f"CONNACK {reason}"}), flush=True)
            done.set()
            return
        c.subscribe([(f, args.qos) for f in [args.filter] + args.also])

    def on_subscribe(_c, _userdata, _mid, reasons, _props):
        if any(r.is_failure for r in reasons):
            print(json.dumps({"error": f"SUBACK {reasons}"}), flush=True)
            done.set()
            return
        granted.extend(r.value for r in reasons)
        subscribed.set()
        print("ready", flush=True)

    def on_message(_c, _userdata, msg):
        nonlocal received
        received += 1
        if args.lines:
            line = {
                "topic": msg.topic,
                "payload": msg.payload.decode("latin-1"),
                "qos": msg.qos,
                "retain": bool(msg.retain),
            }
            print(json.dumps(line), flush=True)
        parts = msg.payload.split(b" ")
        if len(parts) >= 3 and parts[0] == b"t1":
            seqs.append(int(parts[1]))
        if received >= args.count:
            done.set()

    def on_disconnect(_c, _userdata, _flags, reason, _props):
        # Said on stderr: a test that sees a second SUBACK can tell why.
        print(f"mqtt_peer: disconnected: {reason}", file=sys.stderr, flush=True)

    c.on_connect = on_connect
    c.on_disconnect = on_disconnect
    c.on_subscribe = on_subscribe
    c.on_message = on_message
    c.connect(args.host, args.port, keepalive=30)
    c.loop_start()
    done.wait(args.timeout)
    c.disconnect()
    c.loop_stop()
    print(
        json.dumps(
            {
                "received": received,
                "in_order": seqs == list(range(1, len(seqs) + 1)),
                "first": seqs[:3],
                "granted": granted,
            }
        ),
        flush=True,
    )


def pub(args):
    c = client(args, "pub")
    c.connect(args.host, args.port, keepalive=30)
    c.loop_start()
    start = time.monotonic()
    acked = 0
    for seq in range(1, args.count + 1):
        due = start + (seq - 1) / args.rate
        time.sleep(max(0.0, due - time.monotonic()))
        payload = f"t1 {seq} {time.time_ns()} ".encode()
        info = c.publish(args.topic, payload, qos=args.qos)
        if args.qos:
            info.wait_for_publish(10)
            acked += int(info.is_published())
    c.disconnect()
    c.loop_stop()
    print(json.dumps({"published": args.count, "acked": acked}), flush=True)


def send(args):
    c = client(args, "send")
    c.connect(args.host, args.port, keepalive=30)
    c.loop_start()
    sent = acked = 0
    for line in sys.stdin:
        info = c.publish(args.topic, line.rstrip("\n").encode("latin-1"), qos=args.qos, retain=args.retain)
        sent += 1
        if args.qos:
            info.wait_for_publish(10)
            acked += int(info.is_published())
    c.disconnect()
    c.loop_stop()
    print(json.dumps({"sent": sent, "acked": acked}), flush=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["sub", "pub", "send"])
    p.add_argument("host")
    p.add_argument("port", type=int)
    p.add_argument("filter", metavar="FILTER_OR_TOPIC")
    p.add_argument("--qos", type=int, default=0)
    p.add_argument("--and", dest="also", action="append", default=[], metavar="FILTER")
    p.add_argument("--count", type=int, default=0)
    p.add_argument("--rate", type=float, default=10.0)
    p.add_argument("--timeout", type=float, default=30.0)
    p.add_argument("--cafile")
    p.add_argument("--v5", action="store_true")
    p.add_argument("--lines", action="store_true")
    p.add_argument("--retain", action="store_true")
    p.add_argument("--ws", metavar="PATH")
    args = p.parse_args()
    args.topic = args.filter
    {"sub": sub, "pub": pub, "send": send}[args.mode](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
