// Subscriber peer for throng serve's interop test (Node `ws`).
//
// usage: node serve_sub.mjs ws://HOST:PORT/<channel> COUNT
//
// Prints "ready" once subscribed, then one JSON line per message received
// ({"binary": bool, "hex": ...}), then closes cleanly and prints
// {"closed": <code the server answered with>}. Gives up after 30 s.
import WebSocket from "ws";

const [url, countArg] = process.argv.slice(2);
const count = Number(countArg);
let got = 0;
const timer = setTimeout(() => {
  console.error("timed out");
  process.exit(2);
}, 30000);

const ws = new WebSocket(url);
ws.on("open", () => console.log("ready"));
ws.on("message", (data, isBinary) => {
  const buf = Buffer.isBuffer(data) ? data : Buffer.concat(data);
  console.log(JSON.stringify({ binary: isBinary, hex: buf.toString("hex") }));
  got += 1;
  if (got === count) ws.close(1000, "done");
});
ws.on("close", (code) => {
  console.log(JSON.stringify({ closed: code }));
  clearTimeout(timer);
});
ws.on("error", (err) => {
  console.error(String(err));
  process.exit(1);
});
