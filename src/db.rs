//! MySQL connection helpers shared by the commands and the relay.

use crate::config::Config;
use mysql_async::{Opts, OptsBuilder, Pool};

/// Why a database URL could not be used.
#[derive(Debug, thiserror::Error)]
pub enum DbUrlError {
    #[error(
        "`mysql.url` is not a valid MySQL URL ({0}); expected mysql://user:password@host:port/database"
    )]
    Invalid(String),
    #[error("`mysql.url` names no database; add it: mysql://user:password@host:port/database")]
    NoDatabase,
}

/// Connection options from `mysql.url`. The URL must name a database: the outbox tables live
/// there.
pub fn opts(config: &Config) -> anyhow::Result<Opts> {
    let url = config.mysql_url()?;
    let opts = Opts::from_url(url).map_err(|e| DbUrlError::Invalid(e.to_string()))?;
    if opts.db_name().is_none_or(str::is_empty) {
        return Err(DbUrlError::NoDatabase.into());
    }
    let builder = OptsBuilder::from_opts(opts).conn_ttl(Some(std::time::Duration::from_secs(300)));
    Ok(builder.into())
}

/// A connection pool for `mysql.url`.
pub fn pool(config: &Config) -> anyhow::Result<Pool> {
    Ok(Pool::new(opts(config)?))
}
