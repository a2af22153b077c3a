// Recovery under load, for throng's tests: `subs` throng.v1 subscribers
// (Node `ws`) of one channel, spread over the given servers; once messages
// flow, every third one is cut off at a random moment (after it has an id
// to come back with), stays away a random while, and reconnects with
// ?since=<last id> to another server of the list. Each message's payload
// is its index; every subscriber must end with 0..want-1, each once, in
// order. Prints one JSON line: {"ok", "reconnects", "markers", "bad"}.
import WebSocket from 'ws';

const [urls, channel, subs, want, seconds] = process.argv.slice(2);
const servers = urls.split(',');
const total = Number(want);
const window = Number(seconds) * 1000;
const state = [];
let reconnects = 0, markers = 0, started = false, done = 0;
const bad = [];

function open(i, server, since) {
  const s = state[i];
  const q = since ? `?since=${encodeURIComponent(since)}` : '';
  const ws = new WebSocket(`${servers[server]}/${channel}${q}`, ['throng.v1']);
  s.ws = ws;
  s.server = server;
  ws.on('open', () => { s.open = true; if (!started) ready(); });
  ws.on('message', (data) => {
    const text = data.toString();
    const nl = text.indexOf('\n');
    const head = text.slice(0, nl), body = Number(text.slice(nl + 1));
    if (head === '!incomplete') { markers += 1; return; }
    s.last = head;
    if (body !== s.got) bad.push(`subscriber ${i}: got ${body} after ${s.got - 1}`);
    s.got = body + 1;
    if (!started) chaos();
    if (s.got === total) finished();
  });
  ws.on('error', () => {});
}

function ready() {
  if (state.every((s) => s.open)) {
    console.log(JSON.stringify({ ready: true }));
  }
}

function chaos() {
  started = true;
  state.forEach((s, i) => {
    if (i % 3 !== 0) return;
    const cut = () => {
      if (s.got >= total) return;
      if (!s.last) return setTimeout(cut, 20);
      s.ws.removeAllListeners('message');
      s.ws.terminate();
      reconnects += 1;
      setTimeout(() => open(i, (s.server + 1) % servers.length, s.last), 20 + Math.random() * 400);
    };
    setTimeout(cut, Math.random() * window * 0.8);
  });
}

function finished() {
  done += 1;
  if (done === state.length) end();
}

function end() {
  console.log(JSON.stringify({ ok: bad.length === 0 && markers === 0, reconnects, markers, bad: bad.slice(0, 10) }));
  process.exit(0);
}

for (let i = 0; i < Number(subs); i++) {
  state.push({ got: 0, last: null, open: false });
  open(i, i % servers.length, null);
}
setTimeout(() => {
  const behind = state.filter((s) => s.got < total).length;
  bad.push(`${behind} subscribers short of ${total} messages after the deadline`);
  end();
}, window + 60000).unref();
