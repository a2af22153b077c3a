//! throng-proto's one integration-test binary: property tests of the codec
//! and interop with an independent implementation (tungstenite).

mod http_props;
mod interop;
mod props;
mod resp_props;
mod support;
