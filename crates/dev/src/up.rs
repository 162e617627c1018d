//! `outbox-dev up`: a local MariaDB + RocketMQ for trying the product, with the schema applied,
//! a config file written, the relay running and sample events enqueued; and `outbox-dev
//! servers`, the servers a test phase shares. Servers stop with the command.

use crate::demo::{wait_for_outcomes, write_demo_events, DemoArgs};
use anyhow::Context;
use clap::Args;
use outbox_devenv::SqlServer;
use outbox_devenv::{
    scratch_dir, shared, BrokerKind, Database, DatabaseKind, MariaDb, MariaDbOptions, RocketMq,
    RocketMqOptions, TopicReader,
};
use rocketmq_outbox::config::Config;
use rocketmq_outbox::outbox::Status;
use rocketmq_outbox::{db, schema};
use rocketmq_outbox::{server_position, CheckpointStore, RelayHandle, RunOptions, SledStore};
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

#[derive(Debug, Args)]
pub struct ServersArgs {
    /// Where to write `NAME=value` lines for the test binaries (written once all are ready).
    #[arg(long)]
    env_file: PathBuf,
}

#[derive(Debug, Args)]
pub struct UpArgs {
    /// Where the servers keep their data and where the config file is written.
    #[arg(long, default_value = ".devenv")]
    dir: PathBuf,
    /// MariaDB port on 127.0.0.1.
    #[arg(long, default_value_t = 13306)]
    mysql_port: u16,
    /// Database for the outbox tables.
    #[arg(long, default_value = "outbox_demo")]
    database: String,
    /// Stop everything and exit after the sample events instead of waiting for Ctrl-C.
    #[arg(long)]
    exit: bool,
}

/// Starts the shared servers, writes their addresses to `--env-file`, and waits for SIGTERM.
pub async fn servers_cmd(args: ServersArgs) -> anyhow::Result<()> {
    let kind = BrokerKind::from_env()?;
    let db_kind = DatabaseKind::from_env()?;
    let database_dir = scratch_dir(&format!("shared-{}", db_kind.name()))?;
    let rocketmq_dir = scratch_dir("shared-rocketmq")?;
    let options = RocketMqOptions {
        kind: Some(kind),
        auto_create_topics: false,
        ..RocketMqOptions::default()
    };
    // Side by side: each start mostly waits for its own server (a test phase starts them anew).
    let (database, rocketmq) = std::thread::scope(|scope| {
        let rocketmq = scope.spawn(|| RocketMq::start_with(&rocketmq_dir, options));
        let database = Database::start(db_kind, &database_dir);
        let rocketmq = rocketmq.join().expect("the RocketMQ start did not panic");
        (database, rocketmq)
    });
    let database = database.with_context(|| format!("{} did not start", db_kind.name()))?;
    let rocketmq = rocketmq.context("RocketMQ did not start")?;
    let text = format!(
        "{}{}={}\n{}={}\n",
        shared::database_env(&database),
        shared::NAMESRV,
        rocketmq.namesrv_addr(),
        BrokerKind::ENV,
        kind.name(),
    );
    let partial = args.env_file.with_extension("partial");
    std::fs::write(&partial, text)?;
    std::fs::rename(&partial, &args.env_file)?;
    eprintln!(
        "shared servers: {} 127.0.0.1:{}, RocketMQ ({}) namesrv {}; env in {}",
        db_kind.name(),
        database.port(),
        kind.name(),
        rocketmq.namesrv_addr(),
        args.env_file.display()
    );
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    drop(rocketmq);
    drop(database);
    Ok(())
}

/// Starts everything, shows the sample events arriving, then waits for Ctrl-C (or exits).
pub async fn up_cmd(args: UpArgs) -> anyhow::Result<()> {
    std::fs::create_dir_all(&args.dir)
        .with_context(|| format!("cannot create {}", args.dir.display()))?;
    let dir = std::fs::canonicalize(&args.dir)?;

    eprintln!(
        "[1/6] starting MariaDB on 127.0.0.1:{} ...",
        args.mysql_port
    );
    let mut options = MariaDbOptions::new(dir.join("mariadb"));
    options.port = Some(args.mysql_port);
    let mariadb = MariaDb::start(options).context("MariaDB did not start")?;
    mariadb.run_sql_as_root(&format!(
        "CREATE DATABASE IF NOT EXISTS `{}`",
        args.database
    ))?;

    eprintln!("[2/6] starting RocketMQ namesrv + broker ...");
    let options = RocketMqOptions {
        keep_store: true,
        ..RocketMqOptions::default()
    };
    let rocketmq =
        RocketMq::start_with(&dir.join("rocketmq"), options).context("RocketMQ did not start")?;

    let config_path = dir.join("outbox-relay.toml");
    eprintln!("[3/6] writing {}", config_path.display());
    write_config(
        &config_path,
        &mariadb.url(&args.database),
        &rocketmq.namesrv_addr(),
        &dir.join("state"),
    )?;
    let config = Config::load(Some(&config_path), serde_json::json!({}))?;

    eprintln!("[4/6] applying migrations, creating topic {DEMO_TOPIC} ...");
    let pool = db::pool(&config)?;
    let mut conn = pool.get_conn().await?;
    let report = schema::migrate(&mut conn, &config.outbox_tables()).await?;
    eprintln!(
        "      {} applied, {} already there",
        report.applied.len(),
        report.already_applied
    );
    drop(conn);
    rocketmq.create_topic(DEMO_TOPIC, 8)?;

    eprintln!(
        "[5/6] starting the relay (checkpoint in {}) ...",
        dir.join("state").display()
    );
    let relay = start_relay(&config).await?;

    eprintln!(
        "[6/6] paying {} orders: business row + event in one transaction each ...",
        3
    );
    let demo = DemoArgs {
        events: 3,
        topic: DEMO_TOPIC.into(),
        wait: Duration::ZERO,
    };
    let written = write_demo_events(&pool, &config.producer(), &demo).await?;
    let ids: Vec<String> = written.iter().map(|e| e.event_id.clone()).collect();
    let rows = wait_for_outcomes(&pool, "outbox_event", &ids, Duration::from_secs(30)).await?;
    anyhow::ensure!(
        rows.iter().all(|r| r.status == Some(Status::Sent)),
        "the relay did not mark the demo events SENT within 30 s; see the log above"
    );
    let mut reader = TopicReader::new(&rocketmq.namesrv_addr(), DEMO_TOPIC).await?;
    let arrived = reader
        .read_at_least(ids.len(), Duration::from_secs(30))
        .await?;
    reader.close().await;
    for event in &written {
        let message = arrived
            .iter()
            .find(|m| m.properties.get("event_id") == Some(&event.event_id));
        match message {
            Some(m) => println!(
                "  order {} -> event {} arrived in RocketMQ: topic {} queue {} offset {} msgId {}",
                event.order_id, event.event_id, m.topic, m.queue_id, m.queue_offset, m.msg_id
            ),
            None => println!(
                "  order {} -> event {} not read back yet",
                event.order_id, event.event_id
            ),
        }
    }

    println!();
    println!("MariaDB   {}", mariadb.url(&args.database));
    println!("RocketMQ  namesrv {}", rocketmq.namesrv_addr());
    println!("config    {}", config_path.display());
    println!(
        "try       cargo run --profile quickstart -p outbox-dev -- -c {} demo --events 5",
        config_path.display()
    );
    println!(
        "          cargo run --profile quickstart -p outbox-dev -- -c {} consume --topic {DEMO_TOPIC} --group demo",
        config_path.display()
    );
    if !args.exit {
        println!("\nthe relay and the servers are running; press Ctrl-C to stop them");
        tokio::signal::ctrl_c().await?;
        eprintln!("stopping ...");
    }
    let summary = relay.stop().await?;
    eprintln!(
        "relay stopped: {} sent, {} failed, checkpoint {}",
        summary.marked.sent, summary.marked.failed, summary.checkpoint
    );
    pool.disconnect().await?;
    drop(rocketmq);
    drop(mariadb);
    Ok(())
}

const DEMO_TOPIC: &str = "outbox-demo";

/// Starts the relay; on the first run its checkpoint is the server's current position, so the
/// demo events written next are all streamed.
async fn start_relay(config: &Config) -> anyhow::Result<RelayHandle> {
    std::fs::create_dir_all(&config.relay.checkpoint_dir)?;
    {
        let store = SledStore::open(&config.relay.checkpoint_dir)?;
        if store.load()?.is_none() {
            let deployment = db::Deployment::resolve(config)?;
            let server = server_position(&deployment.opts).await?;
            store.save(&server.current)?;
        }
    }
    RelayHandle::spawn(config, RunOptions::default(), CancellationToken::new()).await
}

fn write_config(path: &Path, mysql_url: &str, namesrv: &str, state: &Path) -> anyhow::Result<()> {
    let text = format!(
        "# Written by `outbox-dev up` for the local servers.\n\
         [mysql]\nurl = \"{mysql_url}\"\n\n\
         [rocketmq]\nnamesrv_addr = \"{namesrv}\"\n\n\
         [relay]\ncheckpoint_dir = \"{}\"\n",
        state.display()
    );
    std::fs::write(path, text).with_context(|| format!("cannot write {}", path.display()))
}
