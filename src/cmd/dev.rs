//! `outbox-relay dev up`: a local MariaDB + RocketMQ for trying the product, with the schema
//! applied, a config file written and sample events enqueued. Servers stop with the command.

use super::demo::{write_demo_events, DemoArgs};
use super::GlobalArgs;
use anyhow::Context;
use clap::{Args, Subcommand};
use mysql_async::prelude::*;
use outbox_relay::config::Config;
use outbox_relay::devenv::{MariaDb, MariaDbOptions, RocketMq};
use outbox_relay::producer::Outbox;
use outbox_relay::{db, schema};
use std::path::{Path, PathBuf};

#[derive(Debug, Args)]
pub struct DevArgs {
    #[command(subcommand)]
    action: DevAction,
}

#[derive(Debug, Subcommand)]
enum DevAction {
    /// Start MariaDB and RocketMQ, migrate, enqueue sample events; run until Ctrl-C.
    Up(UpArgs),
}

#[derive(Debug, Args)]
struct UpArgs {
    /// Where the servers keep their data and where the config file is written.
    #[arg(long, default_value = ".devenv")]
    dir: PathBuf,
    /// MariaDB port on 127.0.0.1.
    #[arg(long, default_value_t = 13306)]
    mysql_port: u16,
    /// Database for the outbox tables.
    #[arg(long, default_value = "outbox_demo")]
    database: String,
    /// Stop the servers and exit after the sample events instead of waiting for Ctrl-C.
    #[arg(long)]
    exit: bool,
}

pub async fn run(_global: &GlobalArgs, args: DevArgs) -> anyhow::Result<()> {
    match args.action {
        DevAction::Up(up) => up_cmd(up).await,
    }
}

async fn up_cmd(args: UpArgs) -> anyhow::Result<()> {
    std::fs::create_dir_all(&args.dir)
        .with_context(|| format!("cannot create {}", args.dir.display()))?;
    let dir = std::fs::canonicalize(&args.dir)?;

    eprintln!(
        "[1/5] starting MariaDB on 127.0.0.1:{} ...",
        args.mysql_port
    );
    let mut options = MariaDbOptions::new(dir.join("mariadb"));
    options.port = Some(args.mysql_port);
    let mariadb = MariaDb::start(options).context("MariaDB did not start")?;
    mariadb.run_sql_as_root(&format!(
        "CREATE DATABASE IF NOT EXISTS `{}`",
        args.database
    ))?;

    eprintln!("[2/5] starting RocketMQ namesrv + broker ...");
    let rocketmq = RocketMq::start(&dir.join("rocketmq")).context("RocketMQ did not start")?;

    let config_path = dir.join("outbox-relay.toml");
    eprintln!("[3/5] writing {}", config_path.display());
    write_config(
        &config_path,
        &mariadb.url(&args.database),
        &rocketmq.namesrv_addr(),
        &dir.join("state"),
    )?;
    let config = Config::load(Some(&config_path), serde_json::json!({}))?;

    eprintln!("[4/5] applying migrations ...");
    let pool = db::pool(&config)?;
    let mut conn = pool.get_conn().await?;
    let report = schema::migrate(&mut conn, &config.outbox_tables()).await?;
    eprintln!(
        "      {} applied, {} already there",
        report.applied.len(),
        report.already_applied
    );
    drop(conn);

    eprintln!("[5/5] enqueueing sample events with the producer API ...");
    let demo = DemoArgs {
        events: 3,
        topic: "outbox-demo".into(),
    };
    let written = write_demo_events(&pool, &Outbox::from_config(&config), &demo).await?;
    let mut conn = pool.get_conn().await?;
    let pending: u64 = conn
        .query_first("SELECT COUNT(*) FROM outbox_event WHERE status = 0")
        .await?
        .unwrap_or_default();
    for event in &written {
        println!(
            "  order {} paid -> event {}",
            event.order_id, event.event_id
        );
    }
    println!("  outbox_event now holds {pending} PENDING event(s) for topic outbox-demo");
    drop(conn);
    pool.disconnect().await?;

    println!();
    println!("MariaDB   {}", mariadb.url(&args.database));
    println!("RocketMQ  namesrv {}", rocketmq.namesrv_addr());
    println!("config    {}", config_path.display());
    println!(
        "try       outbox-relay -c {} demo --events 5",
        config_path.display()
    );
    if args.exit {
        return Ok(());
    }
    println!("\nservers are running; press Ctrl-C to stop them");
    tokio::signal::ctrl_c().await?;
    eprintln!("stopping ...");
    drop(rocketmq);
    drop(mariadb);
    Ok(())
}

fn write_config(path: &Path, mysql_url: &str, namesrv: &str, state: &Path) -> anyhow::Result<()> {
    let text = format!(
        "# Written by `outbox-relay dev up` for the local servers.\n\
         [mysql]\nurl = \"{mysql_url}\"\n\n\
         [rocketmq]\nnamesrv_addr = \"{namesrv}\"\n\n\
         [relay]\ncheckpoint_dir = \"{}\"\n",
        state.display()
    );
    std::fs::write(path, text).with_context(|| format!("cannot write {}", path.display()))
}
