//! TCP proxies in front of a SQL server: one that cuts connections at chosen points (a fault
//! `KILL` can only hit by luck, in the middle of the relay's start-up checks, say), and one whose
//! address can be moved to another server, as a failover moves a virtual IP or a DNS name.

use rocketmq_outbox::config::Config;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
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

    /// `url` with its host and port replaced by the proxy's (see `proxied_url`).
    pub fn url(&self, url: &str) -> String {
        proxied_url(url, self.port)
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

/// Forwards loopback connections to the server it currently points at: a new connection goes to
/// the server of the last [`MovableProxy::move_to`], while connections made earlier stay with
/// the server they reached (as after a virtual IP moved: established TCP sessions live on).
pub struct MovableProxy {
    port: u16,
    upstream: Arc<Mutex<String>>,
    task: JoinHandle<()>,
}

impl MovableProxy {
    /// A proxy pointing at `127.0.0.1:port`.
    pub async fn start(port: u16) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let proxy_port = listener.local_addr().unwrap().port();
        let upstream = Arc::new(Mutex::new(format!("127.0.0.1:{port}")));
        let target = Arc::clone(&upstream);
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let to = target.lock().unwrap().clone();
                tokio::spawn(async move {
                    if let Ok(server) = TcpStream::connect(&to).await {
                        forward(client, server, None).await;
                    }
                });
            }
        });
        MovableProxy {
            port: proxy_port,
            upstream,
            task,
        }
    }

    /// New connections go to `127.0.0.1:port` from now on.
    pub fn move_to(&self, port: u16) {
        *self.upstream.lock().unwrap() = format!("127.0.0.1:{port}");
    }

    /// `url` (`mysql://user@host:port/database`) pointed at the proxy, over TCP.
    pub fn url(&self, url: &str) -> String {
        proxied_url(url, self.port)
    }
}

impl Drop for MovableProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// `url` with its host and port replaced by the proxy's `port`. The driver must not switch to
/// the server's Unix socket (what it does for a local server by default), around the proxy.
fn proxied_url(url: &str, port: u16) -> String {
    let (credentials, rest) = url.split_once('@').expect("a mysql:// URL with a host");
    let database = rest.split_once('/').map_or("", |(_, db)| db);
    let separator = if database.contains('?') { '&' } else { '?' };
    format!("{credentials}@127.0.0.1:{port}/{database}{separator}prefer_socket=false")
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
