//! throng-proto's one integration-test binary: property tests of the codec
//! and interop with an independent implementation (tungstenite).

mod interop;
mod props;
mod support;
