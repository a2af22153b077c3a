#!/usr/bin/env node
// An independent push server for `throng hold` tests and benchmarks, on
// Node `ws` (faster to accept than the Python peer, for tens of thousands of
// connections). Same interface as hold_server.py:
//
//   WebSocket subscribe on ws://127.0.0.1:<port>/<channel>
//   POST http://127.0.0.1:<http port>/publish/<channel>  -> {"subscribers": N}
//   --ports N          listen for WebSocket on N consecutive ports
//   --refuse-every K   answer every K-th upgrade with 503
//   --close-every K    close every K-th connection after the handshake (--close-code, default 4000)
//   --publish-delay MS wait MS before delivering each publish and answering it (a publish
//                      endpoint with a service time, for capacity tests)
//
// Prints `READY <first_port> <last_port> <http_port>`, serves until stdin closes.
'use strict';
const http = require('http');
const net = require('net');
const { WebSocketServer } = require('ws');

const args = { ports: 1, refuseEvery: 0, closeEvery: 0, closeCode: 4000, publishDelay: 0 };
for (let i = 2; i < process.argv.length; i += 2) {
  const v = Number(process.argv[i + 1]);
  switch (process.argv[i]) {
    case '--ports': args.ports = v; break;
    case '--refuse-every': args.refuseEvery = v; break;
    case '--close-every': args.closeEvery = v; break;
    case '--close-code': args.closeCode = v; break;
    case '--publish-delay': args.publishDelay = v; break;
    default: console.error(`unknown argument ${process.argv[i]}`); process.exit(2);
  }
}

const channels = new Map();
let upgrades = 0;
let opened = 0;

function probe(port) {
  return new Promise((resolve) => {
    const s = net.createServer();
    s.once('error', () => resolve(false));
    s.listen(port, '127.0.0.1', () => s.close(() => resolve(true)));
  });
}

async function freeRange(n) {
  for (let attempt = 0; attempt < 200; attempt++) {
    const first = 20000 + Math.floor(Math.random() * 30000);
    let ok = true;
    for (let p = first; p < first + n && ok; p++) ok = await probe(p);
    if (ok) return first;
  }
  throw new Error('no free port range');
}

function listen(server, port) {
  return new Promise((resolve, reject) => {
    server.once('error', reject);
    server.listen({ port, host: '127.0.0.1', backlog: 4096 }, resolve);
  });
}

async function main() {
  const wss = new WebSocketServer({ noServer: true, perMessageDeflate: false, clientTracking: false });
  wss.on('connection', (ws, req) => {
    opened++;
    if (args.closeEvery && opened % args.closeEvery === 0) {
      ws.close(args.closeCode, 'test peer closes this one');
      return;
    }
    const name = req.url.slice(1).split('?')[0];
    let set = channels.get(name);
    if (!set) { set = new Set(); channels.set(name, set); }
    set.add(ws);
    ws.on('close', () => set.delete(ws));
    ws.on('error', () => set.delete(ws));
  });
  const first = await freeRange(args.ports);
  for (let p = first; p < first + args.ports; p++) {
    const server = http.createServer((req, res) => { res.writeHead(404); res.end(); });
    server.on('upgrade', (req, socket, head) => {
      upgrades++;
      if (args.refuseEvery && upgrades % args.refuseEvery === 0) {
        socket.end('HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n');
        return;
      }
      wss.handleUpgrade(req, socket, head, (ws) => wss.emit('connection', ws, req));
    });
    await listen(server, p);
  }
  const control = http.createServer((req, res) => {
    const chunks = [];
    req.on('data', (c) => chunks.push(c));
    req.on('end', () => {
      if (req.method === 'POST' && req.url.startsWith('/publish/')) {
        const deliver = () => {
          const set = channels.get(req.url.slice('/publish/'.length)) || new Set();
          const body = Buffer.concat(chunks).toString('utf8');
          for (const ws of set) ws.send(body);
          const out = JSON.stringify({ subscribers: set.size });
          res.writeHead(200, { 'Content-Type': 'application/json', 'Content-Length': Buffer.byteLength(out) });
          res.end(out);
        };
        if (args.publishDelay > 0) setTimeout(deliver, args.publishDelay); else deliver();
      } else {
        res.writeHead(404, { 'Content-Length': 0 });
        res.end();
      }
    });
  });
  control.keepAliveTimeout = 0;
  await listen(control, 0);
  process.stdout.write(`READY ${first} ${first + args.ports - 1} ${control.address().port}\n`);
  process.stdin.on('end', () => process.exit(0));
  process.stdin.resume();
}

main().catch((e) => { console.error(e); process.exit(1); });
