//! throng-host
