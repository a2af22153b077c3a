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

  mqtt_peer.py session HOST PORT FILTER --client-id ID --qos Q --count N
                 [--subscribe] [--v5 --expiry S] [--timeout S]
      Connects without clean start (3.1.1: clean session 0; 5.0: clean
      start 0 and Session Expiry Interval S) and prints {"present": ...}
      from CONNACK; with --subscribe subscribes to FILTER; prints "ready";
      then one JSON line per message, and after N messages (or the
      timeout) disconnects cleanly and prints {"received": N}.

  mqtt_peer.py hold HOST PORT - --client-id ID [--v5] [--timeout S]
      Connects as ID (clean), prints {"connected": true} once CONNACK came,
      then waits until the server ends the connection (or the timeout) and
      prints {"disconnected": CODE}: 5.0's DISCONNECT reason code (0x8E,
      142, for a takeover), or -1 when the connection closed without one
      (3.1.1) or was still open at the timeout. Never reconnects.

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


def session(args):
    c = mqtt.Client(
        mqtt.CallbackAPIVersion.VERSION2,
        client_id=args.client_id,
        protocol=mqtt.MQTTv5 if args.v5 else mqtt.MQTTv311,
        clean_session=None if args.v5 else False,
        # Acknowledged in on_message, so the PUBACK is out before the DISCONNECT.
        manual_ack=True,
    )
    received = 0
    done = threading.Event()

    def ready():
        print("ready", flush=True)
        if args.count == 0:
            done.set()

    def on_connect(c, _userdata, flags, reason, _props):
        if reason.is_failure:
            print(json.dumps({"error": f"CONNACK {reason}"}), flush=True)
            done.set()
            return
        print(json.dumps({"present": bool(flags.session_present)}), flush=True)
        if args.subscribe:
            c.subscribe(args.filter, args.qos)
        else:
            ready()

    def on_subscribe(_c, _userdata, _mid, _reasons, _props):
        ready()

    def on_message(c, _userdata, msg):
        nonlocal received
        received += 1
        line = {"topic": msg.topic, "payload": msg.payload.decode("latin-1"), "qos": msg.qos}
        print(json.dumps(line), flush=True)
        c.ack(msg.mid, msg.qos)
        if received >= args.count:
            done.set()

    c.on_connect = on_connect
    c.on_subscribe = on_subscribe
    c.on_message = on_message
    props = None
    if args.v5:
        from paho.mqtt.packettypes import PacketTypes
        from paho.mqtt.properties import Properties

        props = Properties(PacketTypes.CONNECT)
        props.SessionExpiryInterval = args.expiry
        c.connect(args.host, args.port, keepalive=30, clean_start=False, properties=props)
    else:
        c.connect(args.host, args.port, keepalive=30)
    c.loop_start()
    done.wait(args.timeout)
    c.disconnect()
    c.loop_stop()
    print(json.dumps({"received": received}), flush=True)


def hold(args):
    c = mqtt.Client(
        mqtt.CallbackAPIVersion.VERSION2,
        client_id=args.client_id,
        protocol=mqtt.MQTTv5 if args.v5 else mqtt.MQTTv311,
    )
    code = None

    def on_connect(_c, _userdata, _flags, reason, _props):
        print(json.dumps({"connected": not reason.is_failure}), flush=True)

    def on_disconnect(_c, _userdata, _flags, reason, _props):
        nonlocal code
        # 3.1.1 has no reason to give: the connection just closes.
        code = reason.value if args.v5 and reason is not None else -1

    c.on_connect = on_connect
    c.on_disconnect = on_disconnect
    c.connect(args.host, args.port, keepalive=30)
    # Our own loop, not loop_start's: that one would connect again.
    deadline = time.monotonic() + args.timeout
    while code is None and time.monotonic() < deadline:
        c.loop(0.1)
    print(json.dumps({"disconnected": -1 if code is None else code}), flush=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["sub", "pub", "send", "session", "hold"])
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
    p.add_argument("--client-id", default="")
    p.add_argument("--subscribe", action="store_true")
    p.add_argument("--expiry", type=int, default=0)
    args = p.parse_args()
    args.topic = args.filter
    modes = {"sub": sub, "pub": pub, "send": send, "session": session, "hold": hold}
    modes[args.mode](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
