//! The JSON form over HTTP: `alloxctl gateway` and its bearer token
//! (`alloxctl token`).

use clap::Args;
use std::path::{Path, PathBuf};

/// Where the gateway's token is kept.
#[derive(Args, Debug, Clone, PartialEq, Eq)]
pub struct TokenFileArg {
    /// The token file (mode 0600, made on first use) [default: gateway.token
    /// beside the control socket].
    #[arg(long, value_name = "FILE", env = "ALLOX_TOKEN_FILE")]
    pub token_file: Option<PathBuf>,
}

impl TokenFileArg {
    /// The file given, or the one beside `socket`.
    pub fn resolve(&self, socket: &Path) -> PathBuf {
        self.token_file
            .clone()
            .unwrap_or_else(|| allox_gateway::token::default_path(socket))
    }
}

/// How to run the HTTP gateway.
#[derive(Args, Debug, Clone, PartialEq, Eq)]
pub struct GatewayArgs {
    /// Address to listen on (`host:port`; port 0 picks a free one). Only
    /// loopback addresses unless --allow-remote.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8092")]
    pub listen: String,
    #[command(flatten)]
    pub token: TokenFileArg,
    /// Read the token from this environment variable instead of a file
    /// (e.g. a Kubernetes Secret given through `secretKeyRef`); at least
    /// 32 visible ASCII characters.
    #[arg(long, value_name = "NAME", conflicts_with = "token_file")]
    pub token_env: Option<String>,
    /// Listen on an address that is not loopback (the token then travels
    /// in clear text over that network).
    #[arg(long)]
    pub allow_remote: bool,
    /// Accept this `Host` header value too (repeatable), e.g. a name the
    /// gateway is reached by with --allow-remote.
    #[arg(long, value_name = "HOST[:PORT]")]
    pub allow_host: Vec<String>,
    /// Serve browsers' requests from this origin (repeatable), e.g.
    /// `https://app.example`; none by default.
    #[arg(long, value_name = "URL")]
    pub allow_origin: Vec<String>,
    /// Serve each exposed port at a host of its own below this domain,
    /// `{port}-{id}.DOMAIN` (`alloxctl port list` names each port's
    /// host), so that no two ports share a browser's origin. `localhost`
    /// (the default) needs no DNS: browsers and curl take every name
    /// below it for the loopback. Elsewhere, point a wildcard record
    /// (`*.DOMAIN`) at the gateway.
    #[arg(long, value_name = "DOMAIN", default_value = "localhost")]
    pub ports_domain: String,
    /// Give up on a call to the daemon after this long: the client gets
    /// 504 `unavailable` and the worker a new daemon connection. (A file
    /// moves in many calls, each bounded by this.)
    #[arg(long, value_name = "MS", default_value_t = 30_000)]
    pub daemon_timeout_ms: u64,
    /// Give up on an HTTP client whose request body has not come after
    /// this long (408), or that reads nothing of its answer for this long.
    /// (For a file: each piece of the body, each write of the answer.)
    #[arg(long, value_name = "MS", default_value_t = 10_000)]
    pub http_timeout_ms: u64,
    /// The gateway's log on standard error: text, or one JSON object per
    /// line (time, level, target, message, and each call's action, agent,
    /// session and HTTP status; never a token, params or file content).
    /// `ALLOX_LOG` filters it (default `info`).
    #[arg(long, env = "ALLOX_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// Serve `GET /metrics` on the gateway's address to callers with the
    /// token in this file (mode 0600, at least 32 visible ASCII
    /// characters; not the gateway's own token). Without it or
    /// --metrics-token-env, `/metrics` is served only on --metrics-listen.
    #[arg(long, value_name = "FILE")]
    pub metrics_token_file: Option<PathBuf>,
    /// The metrics token from this environment variable instead.
    #[arg(long, value_name = "NAME", conflicts_with = "metrics_token_file")]
    pub metrics_token_env: Option<String>,
    /// Also listen on this address for `GET /metrics` (and `/healthz`)
    /// with no token: for a Prometheus that scrapes by annotation. Only
    /// loopback addresses unless --allow-remote.
    #[arg(long, value_name = "ADDR")]
    pub metrics_listen: Option<String>,
    /// Spool file bodies larger than a chunk (512 KiB) in this directory,
    /// as files with no name, and pass them to the daemon open, which
    /// moves the bytes itself (on the store's Btrfs, a reflink). Default:
    /// $TMPDIR, else /tmp, where it can hold a file (else files go in
    /// frames).
    #[arg(long, value_name = "DIR", conflicts_with = "files_framed")]
    pub spool_dir: Option<PathBuf>,
    /// Move every file's bytes in frames, as to a daemon on another
    /// machine: no spool.
    #[arg(long)]
    pub files_framed: bool,
}

/// How logs are written.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

impl GatewayArgs {
    /// The gateway's configuration, for the daemon at `socket`.
    pub fn config(&self, socket: &Path) -> allox_gateway::GatewayConfig {
        let mut cfg = allox_gateway::GatewayConfig::new(self.listen.clone(), socket);
        cfg.token_file = self.token.resolve(socket);
        cfg.token_env = self.token_env.clone();
        cfg.allow_remote = self.allow_remote;
        cfg.allow_hosts = self.allow_host.clone();
        cfg.allow_origins = self.allow_origin.clone();
        cfg.ports_domain = self.ports_domain.clone();
        cfg.daemon_timeout = std::time::Duration::from_millis(self.daemon_timeout_ms.max(1));
        cfg.http_timeout = std::time::Duration::from_millis(self.http_timeout_ms.max(1));
        cfg.metrics_token_file = self.metrics_token_file.clone();
        cfg.metrics_token_env = self.metrics_token_env.clone();
        cfg.metrics_listen = self.metrics_listen.clone();
        if self.files_framed {
            cfg.spool = allox_gateway::SpoolAt::Off;
        } else if let Some(dir) = &self.spool_dir {
            cfg.spool = allox_gateway::SpoolAt::Dir(dir.clone());
        }
        cfg
    }
}
