"""Scrapes a Prometheus endpoint as Prometheus would: an HTTP GET with
urllib, the text read by prometheus_client's own parser (a format error is
an exception, and exit 2). Scrapes again every 0.2 s until each
`--at-least SAMPLE MIN` holds (SAMPLE as printed: name{labels}), then prints
one JSON object: "samples" (every sample by that name, its value) and
"types" (every family's type). Exit 1 after --timeout seconds without."""

import argparse
import json
import sys
import time
import urllib.request

from prometheus_client.parser import text_string_to_metric_families


def scrape(url):
    with urllib.request.urlopen(url, timeout=10) as r:
        kind = r.headers.get("Content-Type", "")
        text = r.read().decode()
    samples, types = {}, {}
    for family in text_string_to_metric_families(text):
        types[family.name] = family.type
        for s in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in s.labels.items())
            samples[f"{s.name}{{{labels}}}"] = s.value
    return kind, samples, types


def main():
    p = argparse.ArgumentParser()
    p.add_argument("url")
    p.add_argument("--at-least", nargs=2, action="append", default=[],
                   metavar=("SAMPLE", "MIN"))
    p.add_argument("--timeout", type=float, default=60)
    args = p.parse_args()
    end = time.monotonic() + args.timeout
    last = None
    while True:
        try:
            kind, samples, types = scrape(args.url)
        except (OSError, ValueError) as e:
            if isinstance(e, ValueError):
                print(f"not Prometheus text: {e}", file=sys.stderr)
                sys.exit(2)
            last, samples = str(e), None
        if samples is not None:
            missing = [(s, m) for s, m in args.at_least
                       if samples.get(s, float("-inf")) < float(m)]
            if not missing:
                print(json.dumps({"content_type": kind, "samples": samples,
                                  "types": types}))
                return
            last = f"waiting for {missing}; have {samples}"
        if time.monotonic() > end:
            print(f"timed out: {last}", file=sys.stderr)
            sys.exit(1)
        time.sleep(0.2)


if __name__ == "__main__":
    main()
