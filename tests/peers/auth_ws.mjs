// A browser-like subscriber for throng serve's auth tests (Node `ws`, which
// like a browser fails a handshake whose answer names no protocol when it
// offered some, or one it did not offer).
//
// usage: node auth_ws.mjs ws://HOST:PORT/<channel> PROTOCOLS ORIGIN
//   PROTOCOLS: comma-separated Sec-WebSocket-Protocol entries ("" for none),
//   e.g. "throng,bearer.<token>"; ORIGIN: the Origin header ("" for none).
//
// Prints one JSON line: {"open": true, "protocol": "<chosen>"} once
// subscribed, then {"message": "<text>"} for the first message, and exits;
// or {"status": N} when the server refused the upgrade, or {"error": "..."}.
// Gives up after 20 s.
import WebSocket from "ws";

const [url, protocolsArg, origin] = process.argv.slice(2);
const protocols = protocolsArg ? protocolsArg.split(",") : [];
const options = origin ? { origin } : {};
const timer = setTimeout(() => {
  console.log(JSON.stringify({ error: "timed out" }));
  process.exit(2);
}, 20000);
const done = (line) => {
  console.log(JSON.stringify(line));
  clearTimeout(timer);
  process.exit(0);
};

const ws = new WebSocket(url, protocols, options);
ws.on("unexpected-response", (req, res) => {
  req.destroy();
  done({ status: res.statusCode });
});
ws.on("open", () => console.log(JSON.stringify({ open: true, protocol: ws.protocol })));
ws.on("message", (data) => {
  ws.close(1000);
  done({ message: data.toString() });
});
ws.on("error", (err) => done({ error: String(err) }));
