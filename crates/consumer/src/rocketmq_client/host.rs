//! [`ClientHost`]: a RocketMQ client runtime that can be used from any thread or async runtime.
//!
//! `rocketmq-client-rust` 1.0 never creates a runtime of its own: every producer and consumer
//! needs an `Arc<ClientRuntime>`, which needs a `ChildServiceContext`, from a
//! `rocketmq_runtime::RuntimeOwner` (which owns a Tokio runtime) or from a `RuntimeContext`
//! borrowing the caller's. This file bundles them.

use std::future::Future;
use std::io;
use std::sync::{mpsc, Arc};
use std::time::Duration;

use rocketmq_client_rust::{ClientRuntime, ClientRuntimeConfig, TelemetryHandle};
use rocketmq_runtime::{RuntimeConfig, RuntimeContext, RuntimeOwner, TaskKind};

/// A RocketMQ client runtime: either a Tokio runtime of its own (`RuntimeOwner`,
/// [`ClientHost::new`], [`ClientHost::with_workers`]) or the caller's
/// ([`ClientHost::on_current_runtime`]), and a `ClientRuntime` on it.
///
/// Guarantee: client work runs on the host's runtime whatever the caller is (plain thread,
/// `#[tokio::test]` current-thread runtime, another multi-thread runtime), because
/// [`ClientHost::run`] and [`ClientHost::block_on`] spawn the future there and only wait for its
/// output. Dropping a host of its own shuts the client runtime down (up to 5 s) and then the Tokio
/// runtime; do not drop it from inside a future it runs. A host on the caller's runtime has no
/// thread of its own: never `block_on` it from that runtime's worker; end it with
/// [`ClientHost::shutdown`] (its `Drop` only asks the client to stop). It borrows the runtime
/// through `rocketmq_runtime::RuntimeContext`, which that crate marks `doc(hidden)` ("test and
/// migration harness"): check it on each upgrade of the client.
pub struct ClientHost {
    owner: Option<RuntimeOwner>,
    client_runtime: Arc<ClientRuntime>,
    handle: tokio::runtime::Handle,
    /// Set when the client runs on the caller's runtime ([`ClientHost::on_current_runtime`]).
    borrowed: Option<RuntimeContext>,
}

impl ClientHost {
    /// Builds the runtimes with two worker threads; `name` prefixes the runtime's thread names.
    pub fn new(name: &'static str) -> io::Result<Self> {
        Self::with_workers(name, 2)
    }

    /// Builds the runtimes with `workers` worker threads (at least one).
    pub fn with_workers(name: &'static str, workers: usize) -> io::Result<Self> {
        let owner = RuntimeOwner::plan(RuntimeConfig::for_parallelism(name, workers))
            .map_err(|e| io::Error::other(format!("invalid RocketMQ client runtime config: {e}")))?
            .build()
            .map_err(|e| {
                io::Error::other(format!("cannot build the RocketMQ client runtime: {e}"))
            })?;
        let config = ClientRuntimeConfig {
            shutdown_timeout: Duration::from_secs(5),
            ..ClientRuntimeConfig::default()
        };
        let client_runtime = ClientRuntime::try_new(
            owner.root_context().component("client"),
            config,
            TelemetryHandle::noop(),
        )
        .map_err(|e| io::Error::other(format!("cannot create the RocketMQ ClientRuntime: {e}")))?;
        // RuntimeOwner does not expose its Tokio handle: capture it from a task running there.
        let (tx, rx) = mpsc::channel();
        owner
            .root_context()
            .component("handle")
            .spawn("capture-handle", TaskKind::Worker, async move {
                let _ = tx.send(tokio::runtime::Handle::current());
            })
            .map_err(|e| {
                io::Error::other(format!("cannot spawn on the RocketMQ client runtime: {e}"))
            })?;
        let handle = rx.recv_timeout(Duration::from_secs(10)).map_err(|_| {
            io::Error::other("the RocketMQ client runtime did not run a task within 10 s")
        })?;
        Ok(Self {
            owner: Some(owner),
            client_runtime,
            handle,
            borrowed: None,
        })
    }

    /// A client on the caller's own Tokio runtime: no thread of its own, so a send and its
    /// answer never cross between two runtimes' workers (each crossing is a thread wake-up).
    /// Must be called from inside a runtime. Dropping it does not wait for the client to stop:
    /// call the owner's graceful shutdown first.
    pub fn on_current_runtime(name: &'static str) -> io::Result<Self> {
        let context = RuntimeContext::try_from_current(name)
            .map_err(|e| io::Error::other(format!("no Tokio runtime to run the client on: {e}")))?;
        let config = ClientRuntimeConfig {
            shutdown_timeout: Duration::from_secs(5),
            ..ClientRuntimeConfig::default()
        };
        let client_runtime = ClientRuntime::try_new(
            context.service_context("client"),
            config,
            TelemetryHandle::noop(),
        )
        .map_err(|e| io::Error::other(format!("cannot create the RocketMQ ClientRuntime: {e}")))?;
        Ok(Self {
            owner: None,
            client_runtime,
            handle: tokio::runtime::Handle::current(),
            borrowed: Some(context),
        })
    }

    /// The client runtime to build producers and consumers with.
    pub fn client_runtime(&self) -> Arc<ClientRuntime> {
        Arc::clone(&self.client_runtime)
    }

    /// Runs `future` on this host's runtime and awaits its output from any async context.
    pub async fn run<F>(&self, future: F) -> io::Result<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.handle
            .spawn(future)
            .await
            .map_err(|e| io::Error::other(format!("RocketMQ client task failed: {e}")))
    }

    /// Runs `future` on this host's runtime and blocks the calling thread until it is done.
    /// Safe to call from inside another Tokio runtime (it only blocks this thread).
    pub fn block_on<F>(&self, future: F) -> io::Result<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        let (tx, rx) = mpsc::channel();
        self.spawn(async move {
            let _ = tx.send(future.await);
        });
        rx.recv()
            .map_err(|_| io::Error::other("RocketMQ client task panicked or was cancelled"))
    }

    pub fn spawn(&self, future: impl Future<Output = ()> + Send + 'static) {
        drop(self.handle.spawn(future));
    }

    /// Stops the client runtime (up to its 5 s shutdown timeout) and waits for it; then drops
    /// the host, which finds the client stopped and only ends a runtime of its own. The graceful
    /// end for either kind of host, from any async context.
    pub async fn shutdown(self) {
        let client_runtime = Arc::clone(&self.client_runtime);
        let _ = self
            .run(async move { client_runtime.shutdown().await })
            .await;
        // An owned runtime is shut down by Drop, which blocks: off the async worker.
        let _ = tokio::task::spawn_blocking(move || drop(self)).await;
    }
}

impl Drop for ClientHost {
    fn drop(&mut self) {
        // After [`ClientHost::shutdown`] the client has stopped: only the runtime is left.
        if !self.client_runtime.is_shutdown() {
            let client_runtime = Arc::clone(&self.client_runtime);
            if self.borrowed.is_some() {
                // Blocking here could block the very worker the shutdown needs.
                self.spawn(async move {
                    let _ = client_runtime.shutdown().await;
                });
                return;
            }
            let _ = self.block_on(async move { client_runtime.shutdown().await });
        }
        if let Some(owner) = self.owner.take() {
            owner.shutdown_background();
        }
    }
}

impl std::fmt::Debug for ClientHost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientHost").finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn thread_name() -> String {
        std::thread::current()
            .name()
            .unwrap_or_default()
            .to_string()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn a_host_on_the_callers_runtime_runs_the_client_there() {
        let caller = tokio::spawn(async { thread_name() }).await.unwrap();
        let host = ClientHost::on_current_runtime("host-test-shared").unwrap();
        let ran_on = host.run(async { thread_name() }).await.unwrap();
        assert_eq!(ran_on, caller, "no thread of its own");
        tokio::time::timeout(Duration::from_secs(10), host.shutdown())
            .await
            .expect("the client runtime stops");
    }

    #[tokio::test]
    async fn a_host_of_its_own_runs_the_client_on_its_threads() {
        let host = ClientHost::with_workers("host-test-owned", 1).unwrap();
        let ran_on = host.run(async { thread_name() }).await.unwrap();
        assert!(ran_on.starts_with("host-test-owned"), "{ran_on}");
        tokio::time::timeout(Duration::from_secs(10), host.shutdown())
            .await
            .expect("the client runtime stops");
    }
}
