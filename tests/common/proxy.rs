//! A TCP proxy in front of MariaDB that cuts connections at chosen points: a fault `KILL` can
//! only hit by luck (in the middle of the relay's start-up checks, say).

use rocketmq_outbox::config::Config;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// Forwards loopback connections to a MySQL server, cutting them in turn: the `n`th cut closes
/// a connection (both ways) once the server has sent it `cut_after[n]` bytes. A connection that
/// ends sooner leaves that cut to the next one; after the last cut, connections pass whole.
pub struct CuttingProxy {
    port: u16,
    planned: usize,
    cut: Arc<AtomicUsize>,
    task: JoinHandle<()>,
}

impl CuttingProxy {
    /// A proxy for the server of `url` (`mysql://user:password@host:port/database`).
    pub async fn start(url: &str, cut_after: Vec<usize>) -> Self {
        let upstream = url
            .split('@')
            .nth(1)
            .and_then(|rest| rest.split('/').next())
            .expect("a mysql:// URL with a host")
            .to_string();
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let port = listener.local_addr().unwrap().port();
        let cut = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&cut);
        let planned = cut_after.len();
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let limit = cut_after.get(counter.load(Ordering::SeqCst)).copied();
                let Ok(server) = TcpStream::connect(&upstream).await else {
                    continue;
                };
                let counter = Arc::clone(&counter);
                tokio::spawn(async move {
                    if forward(client, server, limit).await {
                        counter.fetch_add(1, Ordering::SeqCst);
                    }
                });
            }
        });
        CuttingProxy {
            port,
            planned,
            cut,
            task,
        }
    }

    /// A proxy for the server of `config`'s `mysql.url`, which is pointed at the proxy.
    pub async fn reroute(config: &mut Config, cut_after: Vec<usize>) -> Self {
        let url = config.mysql.url.clone().expect("mysql.url");
        let proxy = Self::start(&url, cut_after).await;
        config.mysql.url = Some(proxy.url(&url));
        proxy
    }

    /// `url` with its host and port replaced by the proxy's. The driver must not switch to the
    /// server's Unix socket (what it does for a local server by default), around the proxy.
    pub fn url(&self, url: &str) -> String {
        let (credentials, rest) = url.split_once('@').expect("a mysql:// URL with a host");
        let database = rest.split_once('/').map_or("", |(_, db)| db);
        let separator = if database.contains('?') { '&' } else { '?' };
        format!(
            "{credentials}@127.0.0.1:{}/{database}{separator}prefer_socket=false",
            self.port
        )
    }

    /// How many connections the proxy has cut so far.
    pub fn cut(&self) -> usize {
        self.cut.load(Ordering::SeqCst)
    }

    /// Whether every planned cut has happened.
    pub fn all_cut(&self) -> bool {
        self.cut() >= self.planned
    }
}

impl Drop for CuttingProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Copies both ways until either side closes, or (with `limit`) until the server has sent
/// `limit` bytes; then drops both sockets. True when it cut the connection.
async fn forward(client: TcpStream, server: TcpStream, limit: Option<usize>) -> bool {
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    let upstream = async {
        let _ = tokio::io::copy(&mut client_read, &mut server_write).await;
    };
    let downstream = async {
        let mut left = limit.unwrap_or(usize::MAX);
        let mut buffer = vec![0u8; 16 * 1024];
        while left > 0 {
            let n = match server_read.read(&mut buffer).await {
                Ok(0) | Err(_) => return false,
                Ok(n) => n.min(left),
            };
            if client_write.write_all(&buffer[..n]).await.is_err() {
                return false;
            }
            left -= n;
        }
        true
    };
    tokio::select! {
        _ = upstream => false,
        cut = downstream => cut,
    }
}
