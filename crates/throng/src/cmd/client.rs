//! The arguments `hold` and `attack` share: quiet, the hidden worker
//! switch, and the TLS client options (`wss://`, `https://`) with the
//! check that they make sense for the targets and the warning
//! `--tls-insecure` deserves. The client itself is `throng_load::tls`.

use std::path::PathBuf;

use anyhow::Context as _;
use throng_load::tls::{TlsClient, TlsOptions};

/// What `hold` and `attack` share.
#[derive(Debug, clap::Args)]
pub(crate) struct ClientArgs {
    /// No progress lines.
    #[arg(short, long)]
    pub(crate) quiet: bool,

    #[command(flatten)]
    pub(crate) tls: TlsArgs,

    /// Internal: run as a worker process (plan on stdin).
    #[arg(long, hide = true)]
    pub(crate) worker: bool,

    /// Serve the run's live figures as Prometheus text on http://HOST:PORT/metrics
    /// (counters, levels and latency histograms, every worker and agent merged,
    /// after each interval): 127.0.0.1:9464. See deploy/grafana/load.json.
    #[arg(long, value_name = "HOST:PORT")]
    pub(crate) metrics_listen: Option<std::net::SocketAddr>,
}

impl ClientArgs {
    /// The `--metrics-listen` endpoint, listening, if asked for.
    pub(crate) fn metrics(&self) -> anyhow::Result<Option<throng_load::harness::metrics::Metrics>> {
        Ok(self
            .metrics_listen
            .map(throng_load::harness::metrics::Metrics::listen)
            .transpose()?)
    }
}

/// TLS arguments (used only with wss:// or https:// targets).
#[derive(Debug, clap::Args)]
pub(crate) struct TlsArgs {
    /// TLS: accept ANY server certificate (self-signed test servers). Insecure:
    /// the server is not authenticated. The handshake is otherwise the same.
    #[arg(long)]
    tls_insecure: bool,

    /// TLS: trust the CA certificates in FILE (PEM) instead of the system bundle
    /// (/etc/ssl/certs/ca-certificates.crt).
    #[arg(long, value_name = "FILE", conflicts_with = "tls_insecure")]
    tls_ca: Option<PathBuf>,

    /// TLS: resume sessions (tickets) across each worker's connections, as
    /// returning clients do. Default: off, every connection a full handshake.
    #[arg(long, overrides_with = "no_tls_resume")]
    tls_resume: bool,

    /// TLS: no session resumption (the default).
    #[arg(long, overrides_with = "tls_resume")]
    no_tls_resume: bool,
}

impl TlsArgs {
    /// The options for a run whose targets use TLS (`used`), checked now
    /// (the CA file is read) so a mistake stops the run before it starts;
    /// with `--tls-insecure`, a warning.
    pub(crate) fn options(&self, used: bool) -> anyhow::Result<Option<TlsOptions>> {
        if !used {
            if self.tls_insecure || self.tls_ca.is_some() || self.tls_resume {
                anyhow::bail!(
                    "--tls-insecure, --tls-ca and --tls-resume need a TLS target (wss://, sses://, mqtts:// or https://)"
                );
            }
            return Ok(None);
        }
        let opts = TlsOptions {
            insecure: self.tls_insecure,
            ca_file: self.tls_ca.clone(),
            resume: self.tls_resume && !self.no_tls_resume,
        };
        TlsClient::new(&opts).context("setting up TLS")?;
        if opts.insecure {
            eprintln!(
                "WARNING: --tls-insecure: server certificates are NOT checked; anyone in the path could be the server. Use it only against your own test servers."
            );
        }
        Ok(Some(opts))
    }
}
