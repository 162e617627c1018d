//! `outbox-relay`: the command-line entry point. Each subcommand lives in `src/cmd/`.

#![recursion_limit = "256"]

mod cmd;

use clap::Parser;
use std::process::ExitCode;

/// See Cargo.toml: per-event allocations across threads are cheaper with mimalloc.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Worker threads of the relay's runtime unless `TOKIO_WORKER_THREADS` says otherwise: one.
/// Every stage is I/O-bound (a drain uses about a quarter of a core), and each extra worker
/// costs a wake-up per hand-off between tasks; see `send::rocketmq::client_host` for the
/// measurement. Blocking work (sled's fsync) runs on the blocking pool, never on the worker.
const WORKER_THREADS: usize = 1;

/// Turns transparent huge pages off for this process, as `MIMALLOC_ALLOW_THP=0` would. mimalloc
/// asks for huge pages on its segments and purges freed memory after 10 ms: every page it reuses
/// after a purge faulted in and zeroed 2 MiB again. In a drain that zeroing was 34 % of the
/// relay's CPU (`perf`: `clear_page_erms` under `do_huge_pmd_anonymous_page`, from
/// `mi_page_free_list_extend`). Without: drain CPU per event -42 % and peak RSS 120 → 48 MiB,
/// back to back in `bench/`. Best effort: a kernel without the call keeps its huge pages.
fn disable_transparent_huge_pages() {
    // SAFETY: prctl(2) with integer arguments only; it changes this process's THP policy.
    unsafe {
        libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0);
    }
}

fn main() -> ExitCode {
    disable_transparent_huge_pages();
    let workers =
        rocketmq_outbox::config::thread_count_from_env("TOKIO_WORKER_THREADS", WORKER_THREADS);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build();
    match runtime {
        Ok(runtime) => runtime.block_on(run()),
        Err(error) => {
            eprintln!("error: cannot start the async runtime: {error}");
            ExitCode::FAILURE
        }
    }
}

async fn run() -> ExitCode {
    let cli = cmd::Cli::parse();
    rocketmq_outbox::logging::init(rocketmq_outbox::logging::DEFAULT_FILTER);
    match cmd::run(cli).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}
