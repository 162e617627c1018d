//! Logs to stderr, as every binary of the workspace writes them: `RUST_LOG` when set, else a
//! default filter that keeps the RocketMQ client's chatter out.

/// The relay's default filter: `info`, the RocketMQ client at `warn` (it is chatty at `info`)
/// and its route refreshes at `error`.
pub const DEFAULT_FILTER: &str =
    "info,rocketmq_client_rust=warn,rocketmq_transport=warn,rocketmq_runtime=warn,rocketmq_remoting=warn,\
     rocketmq_client_rust::factory::route_update=error";

/// Installs the process's subscriber: `RUST_LOG` if set, else `default_filter`, to stderr.
pub fn init(default_filter: &str) {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_filter)),
        )
        .with_writer(std::io::stderr)
        .init();
}
