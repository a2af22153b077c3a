// An independent SSE client for throng's tests: the `eventsource` package
// (the WHATWG EventSource for Node). Prints one JSON line per thing it
// sees: {"open":true}, {"id","data"} per message, {"id","binary"} per
// binary event, {"incomplete"} for the marker, {"error"}; exits after
// `want` messages. It reconnects by itself, with Last-Event-ID.
import { EventSource } from 'eventsource';

const [url, want] = process.argv.slice(2);
const say = (o) => process.stdout.write(JSON.stringify(o) + '\n');
let n = 0;
const es = new EventSource(url);
const counted = () => {
  n += 1;
  if (n >= Number(want)) {
    es.close();
    process.exit(0);
  }
};
es.onopen = () => say({ open: true });
es.onerror = (e) => say({ error: String(e?.message ?? e?.code ?? '') });
es.onmessage = (e) => {
  say({ id: e.lastEventId, data: e.data });
  counted();
};
es.addEventListener('binary', (e) => {
  say({ id: e.lastEventId, binary: e.data });
  counted();
});
es.addEventListener('incomplete', (e) => say({ incomplete: e.data }));
// A test never waits on a client that stopped hearing: it says so and ends.
setTimeout(() => {
  say({ timeout: n });
  process.exit(3);
}, 30000).unref();
