//! throng-load
