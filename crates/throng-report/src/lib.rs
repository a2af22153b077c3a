//! throng-report
