//! One broker of a cluster at a time: stopped, killed (`kill -9`), frozen (`SIGSTOP`), thawed and
//! started again, returning only once it is usable again (or, in controller mode, elected).

use super::*;

impl RocketMq {
    /// True while the first master runs.
    pub fn broker_is_running(&mut self) -> bool {
        self.brokers.first_mut().is_some_and(BrokerNode::is_running)
    }

    /// Stops the first master gracefully (`SIGTERM`, then `SIGKILL` after 15 s).
    pub fn stop_broker(&mut self) {
        self.stop_broker_at(0);
    }

    /// Kills the first master with `SIGKILL` (a crash).
    pub fn kill_broker(&mut self) {
        self.kill_broker_at(0);
    }

    /// Freezes the first master with `SIGSTOP`: connections stay open but nothing is answered,
    /// so sends time out (the ambiguous "maybe stored" case). Undo with [`Self::thaw_broker`].
    pub fn freeze_broker(&mut self) {
        self.freeze_broker_at(0);
    }

    /// Resumes the first master (`SIGCONT`).
    pub fn thaw_broker(&mut self) {
        self.thaw_broker_at(0);
    }

    /// (Re)starts the first master; see [`Self::start_broker_at`].
    pub fn start_broker(&mut self) -> io::Result<()> {
        self.start_broker_at(0)
    }

    /// Stops broker `index` gracefully. The name server and the other brokers stay up.
    pub fn stop_broker_at(&mut self, index: usize) {
        self.thaw_broker_at(index); // a frozen process would ignore SIGTERM until the grace ends
        if let Some(mut process) = self.node(index).process.take() {
            process.stop(BROKER_STOP_GRACE);
        }
    }

    /// Kills broker `index` with `SIGKILL`.
    pub fn kill_broker_at(&mut self, index: usize) {
        if let Some(mut process) = self.node(index).process.take() {
            process.kill();
        }
    }

    /// Freezes broker `index` with `SIGSTOP`, returning once each of its threads is stopped.
    pub fn freeze_broker_at(&mut self, index: usize) {
        if let Some(pid) = self.signal(index, libc::SIGSTOP) {
            // kill(2) returns before every thread has stopped: a request sent at once could still
            // be answered. Wait until each thread shows state T (stopped), at most 5 s.
            let deadline = Instant::now() + Duration::from_secs(5);
            while !all_threads_stopped(pid) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }

    /// Resumes broker `index` after [`Self::freeze_broker_at`].
    pub fn thaw_broker_at(&mut self, index: usize) {
        self.signal(index, libc::SIGCONT);
    }

    /// (Re)starts broker `index` with the same ports, config and store, and returns once it is
    /// usable (see the module docs). Does nothing if it is running.
    pub fn start_broker_at(&mut self, index: usize) -> io::Result<()> {
        if self.spawn_broker_at(index)? {
            self.wait_until_usable(index)?;
        }
        Ok(())
    }

    /// Starts broker `index`'s process unless it is running; true if it started one.
    pub(super) fn spawn_broker_at(&mut self, index: usize) -> io::Result<bool> {
        let namesrv = self.namesrv_addr();
        let (kind, options, tls) = (self.kind, self.options.clone(), self.tls.clone());
        let controller = self.controller_addr.clone();
        let node = self.node(index);
        if node.is_running() {
            return Ok(false);
        }
        let command: Command = match kind {
            BrokerKind::Apache => {
                let servers = apache::Servers {
                    namesrv: &namesrv,
                    controller: controller.as_deref(),
                };
                apache::broker_command(node, servers, &options, tls.as_ref())?
            }
            BrokerKind::Rust => rust_broker::broker_command(node, &namesrv, &options)?,
        };
        let log = node.dir.join("broker.out");
        let name = format!("rocketmq broker {}-{}", node.group, node.id);
        node.process = Some(ServerProcess::start(&name, command, &log)?);
        Ok(true)
    }

    pub(super) fn wait_until_usable(&mut self, index: usize) -> io::Result<()> {
        if self.options.controller {
            return self.wait_until_elected(index);
        }
        let namesrv = self.namesrv_addr();
        let security = self.client_security();
        let (group, id) = (self.brokers[index].group.clone(), self.brokers[index].id);
        let master = self.broker_index(&group, 0).unwrap_or(index);
        let has_slave = self.broker_index(&group, 1);
        let slave_running = match has_slave {
            Some(slave) => self.brokers[slave].is_running(),
            None => true, // no slave to wait for: SEND_OK is expected
        };
        let master_running = self.brokers[master].is_running();
        let node = &mut self.brokers[index];
        let process = node.process.as_mut().expect("just started");
        let probe = probe::Probe::new(&namesrv, security)?;
        let mut last = String::from("no attempt finished yet");
        let waited = wait_until_ready(process, BROKER_START_TIMEOUT, "RocketMQ broker", || {
            let result = probe.group_usable(&group, id, master_running, slave_running);
            match result {
                Ok(()) => true,
                Err(e) => {
                    last = e;
                    std::thread::sleep(Duration::from_millis(200));
                    false
                }
            }
        });
        waited.map_err(|e| io::Error::new(e.kind(), format!("{e}\nlast probe failure: {last}")))
    }

    /// Controller mode: waits until broker `index` is registered in its group, the group has an
    /// elected master, and (both brokers running) a probe message is `SEND_OK`.
    fn wait_until_elected(&mut self, index: usize) -> io::Result<()> {
        let namesrv = self.namesrv_addr();
        let security = self.client_security();
        let group = self.brokers[index].group.clone();
        let addr = self.brokers[index].addr();
        let members = (self.brokers.iter_mut())
            .filter(|b| b.group == group)
            .map(|b| b.is_running() as usize)
            .sum();
        let node = &mut self.brokers[index];
        let process = node.process.as_mut().expect("just started");
        let probe = probe::Probe::new(&namesrv, security)?;
        let mut last = String::from("no attempt finished yet");
        let waited =
            wait_until_ready(
                process,
                BROKER_START_TIMEOUT,
                "RocketMQ broker",
                || match probe.elected_group_usable(&group, &addr, members) {
                    Ok(()) => true,
                    Err(e) => {
                        last = e;
                        std::thread::sleep(Duration::from_millis(300));
                        false
                    }
                },
            );
        waited.map_err(|e| io::Error::new(e.kind(), format!("{e}\nlast probe failure: {last}")))
    }
}
