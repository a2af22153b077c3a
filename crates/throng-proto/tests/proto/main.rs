//! throng-proto's one integration-test binary: property tests of the codecs
//! and interop with independent implementations (tungstenite for WebSocket;
//! mqttbytes and bytes Mosquitto sent for MQTT).

mod http_props;
mod interop;
mod mqtt_interop;
mod mqtt_props;
mod props;
mod resp_props;
mod support;
