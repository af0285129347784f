//! A real FTP server for the tests: libunftp serving a temporary directory on 127.0.0.1,
//! on a background thread with its own tokio runtime. We bind the port ourselves and hand
//! each accepted socket to `Server::service` (`listen()` does not report the port).

use std::fmt::Debug;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;

use async_trait::async_trait;
use libunftp::ServerBuilder;
use unftp_core::auth::{AuthenticationError, Authenticator, Credentials, Principal, UserDetail};
use unftp_core::storage::{Fileinfo, Result as StorageResult, StorageBackend};
use unftp_sbe_fs::Filesystem;

pub const USER: &str = "locker";
pub const PASSWORD: &str = "s3cret-pw-do-not-log";

#[derive(Debug)]
struct OneUser;

#[async_trait]
impl Authenticator for OneUser {
    async fn authenticate(
        &self,
        username: &str,
        creds: &Credentials,
    ) -> Result<Principal, AuthenticationError> {
        if username == USER && creds.password.as_deref() == Some(PASSWORD) {
            Ok(Principal {
                username: username.to_string(),
            })
        } else {
            Err(AuthenticationError::BadPassword)
        }
    }
}

/// Fault injection: runs after every successful `MKD`, with the new directory's path on disk,
/// before the reply goes out — the deterministic way to put another client's step exactly
/// between two of ours.
pub type MkdHook = Arc<dyn Fn(&Path) + Send + Sync>;

/// The file-system backend, with an optional [`MkdHook`].
struct Hooked {
    fs: Filesystem,
    root: PathBuf,
    mkd_hook: Option<MkdHook>,
}

impl Debug for Hooked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hooked").field("fs", &self.fs).finish()
    }
}

#[async_trait]
impl<U: UserDetail> StorageBackend<U> for Hooked {
    type Metadata = <Filesystem as StorageBackend<U>>::Metadata;

    fn enter(&mut self, user: &U) -> std::io::Result<()> {
        StorageBackend::<U>::enter(&mut self.fs, user)
    }
    fn supported_features(&self) -> u32 {
        StorageBackend::<U>::supported_features(&self.fs)
    }
    async fn metadata<P: AsRef<Path> + Send + Debug>(
        &self,
        user: &U,
        path: P,
    ) -> StorageResult<Self::Metadata> {
        self.fs.metadata(user, path).await
    }
    async fn list<P: AsRef<Path> + Send + Debug>(
        &self,
        user: &U,
        path: P,
    ) -> StorageResult<Vec<Fileinfo<PathBuf, Self::Metadata>>>
    where
        <Self as StorageBackend<U>>::Metadata: unftp_core::storage::Metadata,
    {
        self.fs.list(user, path).await
    }
    async fn get<P: AsRef<Path> + Send + Debug>(
        &self,
        user: &U,
        path: P,
        start_pos: u64,
    ) -> StorageResult<Box<dyn tokio::io::AsyncRead + Send + Sync + Unpin>> {
        self.fs.get(user, path, start_pos).await
    }
    async fn put<
        P: AsRef<Path> + Send + Debug,
        R: tokio::io::AsyncRead + Send + Sync + Unpin + 'static,
    >(
        &self,
        user: &U,
        input: R,
        path: P,
        start_pos: u64,
    ) -> StorageResult<u64> {
        self.fs.put(user, input, path, start_pos).await
    }
    async fn del<P: AsRef<Path> + Send + Debug>(&self, user: &U, path: P) -> StorageResult<()> {
        self.fs.del(user, path).await
    }
    async fn mkd<P: AsRef<Path> + Send + Debug>(&self, user: &U, path: P) -> StorageResult<()> {
        let on_disk = self
            .root
            .join(path.as_ref().strip_prefix("/").unwrap_or(path.as_ref()));
        self.fs.mkd(user, path).await?;
        if let Some(hook) = &self.mkd_hook {
            hook(&on_disk);
        }
        Ok(())
    }
    async fn rename<P: AsRef<Path> + Send + Debug>(
        &self,
        user: &U,
        from: P,
        to: P,
    ) -> StorageResult<()> {
        self.fs.rename(user, from, to).await
    }
    async fn rmd<P: AsRef<Path> + Send + Debug>(&self, user: &U, path: P) -> StorageResult<()> {
        self.fs.rmd(user, path).await
    }
    async fn cwd<P: AsRef<Path> + Send + Debug>(&self, user: &U, path: P) -> StorageResult<()> {
        self.fs.cwd(user, path).await
    }
}

/// A running server; stopped (every session closed) when dropped.
pub struct FtpServer {
    pub port: u16,
    pub root: tempfile::TempDir,
    /// Certificate chain and key: FTPS (explicit, `AUTH TLS`) required for every session.
    tls: Option<(PathBuf, PathBuf)>,
    /// Sessions idle this long are closed by the server (libunftp's default: 600 s).
    idle_secs: Option<u64>,
    mkd_hook: Option<MkdHook>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl FtpServer {
    pub fn start() -> FtpServer {
        FtpServer::start_with(None, None, None)
    }

    /// A server that closes sessions idle for `secs` seconds.
    pub fn start_idle(secs: u64) -> FtpServer {
        FtpServer::start_with(None, Some(secs), None)
    }

    /// A server that requires explicit FTPS with this certificate chain and key (PEM).
    pub fn start_tls(certs: &Path, key: &Path) -> FtpServer {
        FtpServer::start_with(Some((certs.to_path_buf(), key.to_path_buf())), None, None)
    }

    /// A server that calls `hook` after every successful `MKD` (fault injection).
    pub fn start_with_mkd_hook(hook: MkdHook) -> FtpServer {
        FtpServer::start_with(None, None, Some(hook))
    }

    fn start_with(
        tls: Option<(PathBuf, PathBuf)>,
        idle_secs: Option<u64>,
        mkd_hook: Option<MkdHook>,
    ) -> FtpServer {
        let root = tempfile::Builder::new()
            .prefix("locksmith-ftp-")
            .tempdir_in(testkit::scratch())
            .expect("tempdir");
        std::fs::create_dir(root.path().join("locks")).unwrap();
        let mut s = FtpServer {
            port: 0,
            root,
            tls,
            idle_secs,
            mkd_hook,
            stop: None,
            thread: None,
        };
        s.serve(0);
        s
    }

    /// Serves on `port` (0: any free port).
    fn serve(&mut self, port: u16) {
        let (port_tx, port_rx) = std::sync::mpsc::channel();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let root: PathBuf = self.root.path().to_path_buf();
        let tls = self.tls.clone();
        let idle = self.idle_secs;
        let mkd_hook = self.mkd_hook.clone();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("tokio runtime");
            rt.block_on(async move {
                // A restart rebinds the same port, which a client's ephemeral port may hold
                // for a moment: retry for a while.
                let mut tries = 0;
                let listener = loop {
                    match tokio::net::TcpListener::bind(("127.0.0.1", port)).await {
                        Ok(l) => break l,
                        Err(e) if port != 0 && tries < 200 => {
                            let _ = e;
                            tries += 1;
                            tokio::time::sleep(std::time::Duration::from_millis(25)).await;
                        }
                        Err(e) => panic!("bind 127.0.0.1:{port}: {e}"),
                    }
                };
                port_tx.send(listener.local_addr().unwrap().port()).unwrap();
                let serve = async {
                    loop {
                        let Ok((sock, _)) = listener.accept().await else {
                            continue;
                        };
                        // As real servers do: without it, replies written in pieces wait
                        // for the client's delayed ACK (40 ms a round trip).
                        let _ = sock.set_nodelay(true);
                        let (root, mkd_hook) = (root.clone(), mkd_hook.clone());
                        let mut b = ServerBuilder::with_authenticator(
                            Box::new(move || Hooked {
                                fs: Filesystem::new(root.clone()).expect("fs backend"),
                                root: root.clone(),
                                mkd_hook: mkd_hook.clone(),
                            }),
                            Arc::new(OneUser),
                        )
                        .greeting("locksmith test server");
                        if let Some(secs) = idle {
                            b = b.idle_session_timeout(secs);
                        }
                        if let Some((certs, key)) = &tls {
                            b = b.ftps(certs.clone(), key.clone()).ftps_required(
                                libunftp::options::FtpsRequired::All,
                                libunftp::options::FtpsRequired::All,
                            );
                        }
                        let server = b.build().expect("build server");
                        tokio::spawn(async move {
                            let _ = server.service(sock).await;
                        });
                    }
                };
                tokio::select! {
                    _ = serve => {}
                    _ = stop_rx => {}
                }
            });
            // Dropping the runtime cancels every session: their connections close.
            drop(rt);
        });
        self.port = port_rx.recv().expect("server thread started");
        self.stop = Some(stop_tx);
        self.thread = Some(thread);
    }

    /// Stops the server: every session is cut, the port refuses connections.
    pub fn stop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }

    /// Stops and starts again on the same port (a server restart).
    pub fn restart(&mut self) {
        let port = self.port;
        self.stop();
        self.serve(port);
    }

    pub fn path(&self, p: &str) -> PathBuf {
        self.root.path().join(p)
    }
}

impl Drop for FtpServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// An FTP server the suite in `ftp.rs` runs against: this embedded one, or a real Debian
/// server (`ftp_debian.rs`). Paths are relative to the directory the FTP user logs in to.
pub trait TestFtp {
    /// Which server, for messages.
    fn name(&self) -> &'static str;
    fn port(&self) -> u16;
    fn user(&self) -> &str;
    /// Where `p` (relative to the login directory) is on this machine.
    fn path(&self, p: &str) -> PathBuf;
    /// Stops (every session is cut) and starts again on the same port.
    fn restart(&mut self);
    /// The uid and gid the server acts as, when that is not us: what a test puts into the
    /// server's tree itself must be theirs, or the server could not remove it.
    fn owner(&self) -> Option<(u32, u32)> {
        None
    }
    /// `mkdir`, owned by the server's user.
    fn mkdir(&self, p: &str) {
        let path = self.path(p);
        std::fs::create_dir(&path).unwrap();
        self.give(&path);
    }
    /// Writes a file, owned by the server's user.
    fn write(&self, p: &str, data: &str) {
        let path = self.path(p);
        std::fs::write(&path, data).unwrap();
        self.give(&path);
    }
    fn give(&self, path: &Path) {
        if let Some((uid, gid)) = self.owner() {
            std::os::unix::fs::chown(path, Some(uid), Some(gid)).unwrap();
        }
    }
}

impl TestFtp for FtpServer {
    fn name(&self) -> &'static str {
        "libunftp"
    }
    fn port(&self) -> u16 {
        self.port
    }
    fn user(&self) -> &str {
        USER
    }
    fn path(&self, p: &str) -> PathBuf {
        FtpServer::path(self, p)
    }
    fn restart(&mut self) {
        FtpServer::restart(self)
    }
}
