//! The integration suite: one test binary whose modules share one SQL server and one RocketMQ
//! cluster (the ones `scripts/test.sh` starts, else started on first use; see [`common`]).
//!
//! One binary instead of one per file: the crate and its fixtures are compiled and linked once,
//! and two test threads are kept busy across modules instead of idling at the end of each
//! binary. The price is that tests of different modules run side by side: a test that changes
//! what every client of a server sees (global settings, purged binlogs, a restart) runs on a
//! server of its own ([`common::own_database`]), and one that kills, freezes or reconfigures a
//! broker starts its own cluster.
//!
//! Run one module with a filter: `cargo test --features failpoints --test suite relay_faults::`.
//! A new test file is a module: add it below. The chaos soak is its own binary (`tests/soak.rs`):
//! it starts and restarts its own servers and wants the machine to itself.

mod common;

mod acl;
mod article_checks;
mod bad_input;
mod bad_input_access;
mod bad_input_schema;
mod binlog_variants;
mod broker;
mod cli;
mod cluster;
mod consumer;
mod consumer_cli;
mod consumer_protocol;
mod controller;
mod dashboard;
mod dead_letters;
mod failover;
#[cfg(feature = "failpoints")]
mod fault_hooks;
mod galera;
mod image;
mod isolation;
mod leader;
mod marker;
mod memory;
mod memory_broker;
mod message_ids;
mod metrics;
mod migrate;
mod mysql_file_position;
mod operate;
mod operate_status_replay;
mod partitions;
mod poll;
mod poll_processes;
mod producer;
mod purged_binlog;
mod queue_count;
mod relay;
mod relay_checks;
mod relay_faults;
mod relay_resume;
mod rocketmq5;
mod row_image;
mod scheduled;
mod split_primary;
mod sweeper;
mod switch_over;
mod tls;
mod xa;
