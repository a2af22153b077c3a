// An MQTT client independent of throng's (Node `mqtt`), for the tests; the
// same command line and output as mqtt_peer.py's `sub --lines` and `send`.
//
//   node mqtt_peer.mjs sub HOST PORT FILTER [--and FILTER]... --qos Q --count N
//                      [--timeout S] [--v5]
//     Subscribes to every filter at Q; prints "ready" once SUBACK came, one
//     JSON line per message ({"topic", "payload", "qos", "retain"}), and after
//     N messages or the timeout one last line: {"received", "granted"}.
//
//   node mqtt_peer.mjs send HOST PORT TOPIC --qos Q [--retain] [--v5]
//     Publishes each line of stdin as one message, in order (at QoS 1 each
//     waits for its PUBACK); prints {"sent", "acked"} at the end.
//
//   Either mode with --ws PATH: MQTT over WebSocket to ws://HOST:PORT/PATH.
import readline from "node:readline";
import mqtt from "mqtt";

const [mode, host, port, first, ...rest] = process.argv.slice(2);
const opts = { filters: [first], qos: 0, count: 0, timeout: 30, v5: false, retain: false, ws: null };
for (let i = 0; i < rest.length; i++) {
  const a = rest[i];
  if (a === "--and") opts.filters.push(rest[++i]);
  else if (a === "--qos") opts.qos = Number(rest[++i]);
  else if (a === "--count") opts.count = Number(rest[++i]);
  else if (a === "--timeout") opts.timeout = Number(rest[++i]);
  else if (a === "--v5") opts.v5 = true;
  else if (a === "--retain") opts.retain = true;
  else if (a === "--ws") opts.ws = rest[++i];
  else {
    console.error(`unknown argument ${a}`);
    process.exit(2);
  }
}

const url = opts.ws ? `ws://${host}:${port}${opts.ws}` : `mqtt://${host}:${port}`;
const client = mqtt.connect(url, {
  protocolVersion: opts.v5 ? 5 : 4,
  clean: true,
  clientId: `node-${mode}-${process.pid}`,
  keepalive: 30,
  // One connection per run: a drop is a failure, not something to hide.
  reconnectPeriod: 0,
});
client.on("error", (err) => {
  console.error(String(err));
  process.exit(1);
});

function sub() {
  let received = 0;
  let granted = [];
  const finish = () => {
    console.log(JSON.stringify({ received, granted }));
    client.end(false, {}, () => process.exit(0));
  };
  const timer = setTimeout(finish, opts.timeout * 1000);
  client.on("connect", () => {
    client.subscribe(opts.filters, { qos: opts.qos }, (err, g) => {
      if (err) {
        console.error(`SUBSCRIBE: ${err}`);
        process.exit(1);
      }
      granted = g.map((x) => x.qos);
      console.log("ready");
    });
  });
  client.on("message", (topic, payload, packet) => {
    console.log(
      JSON.stringify({ topic, payload: payload.toString("latin1"), qos: packet.qos, retain: packet.retain }),
    );
    received += 1;
    if (received === opts.count) {
      clearTimeout(timer);
      finish();
    }
  });
}

async function send() {
  await new Promise((resolve) => client.on("connect", resolve));
  let sent = 0;
  let acked = 0;
  for await (const line of readline.createInterface({ input: process.stdin })) {
    // At QoS 1 the callback comes with the PUBACK; at QoS 0 once written.
    await new Promise((resolve, reject) =>
      client.publish(first, Buffer.from(line, "latin1"), { qos: opts.qos, retain: opts.retain }, (err) =>
        err ? reject(err) : resolve(),
      ),
    );
    sent += 1;
    if (opts.qos > 0) acked += 1;
  }
  console.log(JSON.stringify({ sent, acked }));
  client.end(false, {}, () => process.exit(0));
}

if (mode === "sub") sub();
else if (mode === "send") send();
else {
  console.error("usage: mqtt_peer.mjs sub|send HOST PORT FILTER_OR_TOPIC ...");
  process.exit(2);
}
