#!/usr/bin/env python3
"""What an idle MQTT persistent session away costs Redis (issue 27).

    scripts/mqtt-sessions-redis-memory.py [--sessions K] [--subs N ...] [--throng PATH]

Starts its own redis-server (a free port, no persistence) and one
`throng serve --redis` (pattern mode, one worker), then for each N: K
clients (paho, MQTT 3.1.1, clean session 0) each subscribe to N exact
filters of their own (`fleet/<client>/<j>`, QoS 1) and disconnect. Once
Redis holds the K sessions away, ready, it reads Redis's `used_memory`
and prints (used_memory after - before) / K, and the same for N wildcard
filters (`fleet/<client>/<j>/+`), which also join the set of wildcard
filters every publish reads. Nothing is queued: this is a session's own
cost; each queued message adds its entry (payload, topic, 3 bytes, the
seal for MQTT publishes) to a Redis list.

Then, with all those sessions away, what a QoS 1 publish costs Redis:
--publishes HTTP publishes (64 bytes, default 500: under the queue limit) through the node to a topic no
session matches (`other/1`) and to one that one session's filter matches
(`fleet/<its client>/0/x` with a wildcard filter; it queues), each as
Redis's `usec_per_call` of the publish script (`INFO commandstats`,
`cmdstat_evalsha`), beside a plain `PUBLISH` of the same size (QoS 0
never queues: what every publish cost before sessions were in Redis).

Every process it starts is stopped at the end.
"""

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request

import paho.mqtt.client as mqtt

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cli(port, *args):
    out = subprocess.run(
        ["redis-cli", "-p", str(port), *args], capture_output=True, text=True, check=True
    )
    return out.stdout


def used_memory(port):
    for line in cli(port, "INFO", "memory").splitlines():
        if line.startswith("used_memory:"):
            return int(line.split(":")[1])
    raise SystemExit("no used_memory in INFO memory")


def sessions_ready(port):
    keys = cli(port, "--scan", "--pattern", "throng:#s:*").split()
    return sum(cli(port, "HGET", k, "ready").strip() == "1" for k in keys)


def wait(what, ok, timeout=120):
    end = time.monotonic() + timeout
    while not ok():
        if time.monotonic() > end:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.2)


def usec_per_call(port, command):
    for line in cli(port, "INFO", "commandstats").splitlines():
        if line.startswith(f"cmdstat_{command}:"):
            return float(line.split("usec_per_call=")[1].split(",")[0])
    raise SystemExit(f"no cmdstat_{command}")


def publish_cost(rport, http, topic, n):
    """Redis's microseconds per publish script over n HTTP publishes."""
    cli(rport, "CONFIG", "RESETSTAT")
    body = b"x" * 64
    for _ in range(n):
        req = urllib.request.Request(f"http://{http}/publish/{topic}", data=body, method="POST")
        with urllib.request.urlopen(req, timeout=10) as r:
            if r.status != 200:
                raise SystemExit(f"publish answered {r.status}")
    return usec_per_call(rport, "evalsha")


def leave_sessions(mqtt_port, tag, k, filters):
    """K clients, each subscribed to its filters (SUBACK in) and gone."""
    for c in range(k):
        client = mqtt.Client(
            mqtt.CallbackAPIVersion.VERSION2,
            client_id=f"{tag}-{c}",
            protocol=mqtt.MQTTv311,
            clean_session=False,
        )
        subscribed = threading.Event()
        client.on_connect = lambda cl, *_a, c=c: cl.subscribe([(f, 1) for f in filters(c)])
        client.on_subscribe = lambda *_a: subscribed.set()
        client.connect("127.0.0.1", mqtt_port, keepalive=60)
        client.loop_start()
        if not subscribed.wait(10):
            raise SystemExit(f"client {tag}-{c}: no SUBACK")
        client.disconnect()
        client.loop_stop()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sessions", type=int, default=1000)
    p.add_argument("--subs", type=int, nargs="+", default=[1, 10])
    p.add_argument("--publishes", type=int, default=500)
    p.add_argument("--throng", default=os.path.join(ROOT, "target", "debug", "throng"))
    args = p.parse_args()
    # Stopped by a signal, it still stops what it started.
    signal.signal(signal.SIGTERM, lambda *_a: sys.exit(143))
    rport = free_port()
    redis = subprocess.Popen(
        ["redis-server", "--port", str(rport), "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
    )
    serve = None
    try:
        wait("redis", lambda: subprocess.run(
            ["redis-cli", "-p", str(rport), "PING"], capture_output=True
        ).stdout.strip() == b"PONG")
        serve = subprocess.Popen(
            [args.throng, "serve", "--listen", "127.0.0.1:0", "--mqtt-listen", "127.0.0.1:0",
             "--workers", "1", "--json", "--redis", f"redis://127.0.0.1:{rport}",
             "--max-subscriptions", str(max(args.subs) + 1)],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        )
        start = json.loads(serve.stdout.readline())
        mqtt_port = int(start["mqtt_listen"][0].rsplit(":", 1)[1])
        time.sleep(1)
        total = 0
        print(f"{'filters':>8} {'kind':>9} {'sessions':>9} {'bytes/session':>14}")
        for n in args.subs:
            for kind, shape in (("exact", "fleet/{c}/{j}"), ("wildcard", "fleet/{c}/{j}/+")):
                tag = f"{kind}{n}"
                before = used_memory(rport)
                leave_sessions(
                    mqtt_port, tag, args.sessions,
                    lambda c: [shape.format(c=f"{tag}-{c}", j=j) for j in range(n)],
                )
                total += args.sessions
                wait("the sessions away", lambda: sessions_ready(rport) == total)
                after = used_memory(rport)
                per = (after - before) / args.sessions
                print(f"{n:>8} {kind:>9} {args.sessions:>9} {per:>14.0f}", flush=True)
        http = start["listen"][0]
        print(f"with {total} sessions away, Redis us per QoS 1 publish ({args.publishes} each):")
        none = publish_cost(rport, http, "other/1", args.publishes)
        print(f"  no session matches        {none:6.2f}", flush=True)
        one = publish_cost(rport, http, f"fleet/wildcard{max(args.subs)}-0/0/x", args.publishes)
        print(f"  queued for one session    {one:6.2f}", flush=True)
        cli(rport, "CONFIG", "RESETSTAT")
        subprocess.run(
            ["redis-benchmark", "-p", str(rport), "-n", str(args.publishes * 10), "-q",
             "PUBLISH", "throng:other/1", "x" * 64],
            capture_output=True, check=True,
        )
        print(f"  plain PUBLISH             {usec_per_call(rport, 'publish'):6.2f}", flush=True)
    finally:
        for proc in (serve, redis):
            if proc is not None:
                proc.terminate()
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()


if __name__ == "__main__":
    sys.exit(main())
