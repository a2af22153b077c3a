//! throng-server
