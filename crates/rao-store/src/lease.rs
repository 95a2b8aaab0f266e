//! Leases: which run is computing a stage instance right now, kept in the store itself so that
//! every run pointed at it — another terminal, a nightly CI job, a Ray cluster — cooperates.
//!
//! A lease is a small object `leases/<fp>/g<generation>.json` created with a conditional put
//! (`If-None-Match: *` on S3, a hard link locally), so of two runs only one creates a given
//! generation. The holder rewrites its object every `ttl / 4` with a later expiry; a holder that
//! died stops renewing and its lease lapses (at once when it was a process of this machine that no
//! longer exists). Taking over a lapsed lease creates the next generation — again conditionally —
//! so two waiters cannot both win.
//!
//! Leases make each instance execute once; they are not what keeps the store correct. That is the
//! manifest: written once with the same conditional put, so even a holder that lost its lease
//! (paused past its expiry) cannot replace a finished output — its copy is discarded.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::clock::now_secs;
use crate::layout::lease_prefix;
use crate::store::{Store, StoreError, StoreResult};

/// The largest lease generation taken for one (see [`newest`]).
const MAX_GENERATION: u64 = 1 << 50;
/// Reads of a lease object before its error is the caller's (see [`read_lease`]).
const READ_TRIES: u32 = 4;

/// How long a lease lasts without renewal (`RAO_LEASE_TTL`, in seconds, for tests).
pub fn ttl() -> Duration {
    let secs = std::env::var("RAO_LEASE_TTL").ok().and_then(|s| s.parse::<f64>().ok()).filter(|s| s.is_finite() && *s > 0.1);
    Duration::from_secs_f64(secs.unwrap_or(60.0))
}

/// This machine's name, as leases and staging directories record it.
pub fn host_name() -> String {
    static NAME: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    NAME.get_or_init(|| {
        std::fs::read_to_string("/proc/sys/kernel/hostname")
            .or_else(|_| std::fs::read_to_string("/etc/hostname"))
            .map(|s| s.trim().to_string())
            .ok()
            .filter(|s| !s.is_empty())
            .or_else(|| std::env::var("HOSTNAME").ok())
            .unwrap_or_else(|| "localhost".into())
    })
    .clone()
}

/// The PID namespace this process sees (`pid:[4026531836]`; empty where that cannot be read):
/// containers may share a host name, not their processes.
pub fn pid_space() -> &'static str {
    static SPACE: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    SPACE.get_or_init(|| std::fs::read_link("/proc/self/ns/pid").map(|p| p.to_string_lossy().into_owned()).unwrap_or_default())
}

/// Whether the process that a lease or run record names is known to be gone: only a process this
/// one can see is looked for (a record without a PID namespace, from an older rao, by host name).
pub fn recorded_process_is_gone(host: &str, pid_space: &str, pid: u32) -> bool {
    host == host_name() && (pid_space.is_empty() || pid_space == self::pid_space()) && process_is_gone(pid)
}

/// Whether process `pid` of this machine is gone (unknown: `false`). A zombie is gone: it has
/// exited and only waits to be reaped, which in a container whose first process never reaps can
/// be forever.
pub fn process_is_gone(pid: u32) -> bool {
    if !cfg!(target_os = "linux") || !std::path::Path::new("/proc/self").exists() {
        return false;
    }
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // `PID (COMM) STATE …`: the command may hold spaces and parentheses, the state follows the last `)`.
        Ok(stat) => {
            stat.rsplit_once(')').and_then(|(_, rest)| rest.trim_start().chars().next()).is_some_and(|state| matches!(state, 'Z' | 'X'))
        }
        Err(_) => !std::path::Path::new(&format!("/proc/{pid}")).exists(),
    }
}

/// What a lease object says.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct LeaseInfo {
    pub host: String,
    pub pid: u32,
    pub run_id: String,
    pub instance: String,
    pub expires_at: f64,
    /// The holder's PID namespace (see [`pid_space`]; absent in leases of older versions).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub pid_space: String,
}

impl LeaseInfo {
    fn lapsed(&self) -> bool {
        let now = now_secs();
        // A holder renews to now + ttl: an expiry far beyond that (allowing an hour of clock
        // skew between hosts) was not written by one, and would block the stage for ever.
        let forged = self.expires_at.is_nan() || self.expires_at > now + 3600.0 + 10.0 * ttl().as_secs_f64();
        self.expires_at < now || forged || recorded_process_is_gone(&self.host, &self.pid_space, self.pid)
    }
}

/// The result of trying to take a lease.
pub enum Acquired {
    Held(LeaseGuard),
    /// Someone else holds it (what their lease says).
    Busy(LeaseInfo),
}

/// A held lease: renewed in the background until released or dropped.
pub struct LeaseGuard {
    store: Store,
    key: String,
    renewer: tokio::task::JoinHandle<()>,
}

impl LeaseGuard {
    /// Give the lease up (the instance is published, or failed): waiters go on at once.
    pub async fn release(self) {
        self.renewer.abort();
        let _ = self.store.delete(&self.key).await;
    }
}

impl Drop for LeaseGuard {
    fn drop(&mut self) {
        // Dropped without `release` (cancelled, panicked): stop renewing; the lease lapses.
        self.renewer.abort();
    }
}

fn generation_key(fp: &str, generation: u64) -> String {
    format!("{}/g{generation:012}.json", lease_prefix(fp))
}

/// The newest generation of the lease of `fp` and what it says (`None`: nobody ever took it; an
/// inner `None`: its object is gone since the listing — released — or holds what no holder wrote,
/// and then it counts as lapsed).
async fn newest(store: &Store, fp: &str) -> StoreResult<Option<(u64, Option<LeaseInfo>)>> {
    let prefix = format!("{}/", lease_prefix(fp));
    let newest = store
        .list(&prefix)
        .await?
        .into_iter()
        .filter_map(|(key, _)| key.strip_prefix(&prefix)?.strip_prefix('g')?.strip_suffix(".json")?.parse::<u64>().ok())
        // Generations count acquisitions: one beyond this was not written by rao (and would
        // overflow the next one).
        .filter(|g| *g <= MAX_GENERATION)
        .max();
    let Some(generation) = newest else { return Ok(None) };
    Ok(Some((generation, read_lease(store, &generation_key(fp, generation)).await?)))
}

/// What the lease object `key` says: `None` when it is gone or is no lease (bytes no holder wrote:
/// leases are written whole). A read that fails is tried again and then an error — never taken
/// for a lapsed lease, which would let a second run execute the instance beside a live holder.
async fn read_lease(store: &Store, key: &str) -> StoreResult<Option<LeaseInfo>> {
    let mut pause = Duration::from_millis(50);
    let mut tries = 1;
    loop {
        match store.get_json::<LeaseInfo>(key).await {
            Ok(info) => return Ok(info),
            Err(StoreError::Json { .. } | StoreError::TooLarge { .. }) => return Ok(None),
            Err(e) if tries >= READ_TRIES => return Err(e),
            Err(_) => {
                tokio::time::sleep(pause).await;
                pause *= 4;
                tries += 1;
            }
        }
    }
}

/// Who holds the lease of `fp` now, if anyone does.
pub async fn live_holder(store: &Store, fp: &str) -> StoreResult<Option<LeaseInfo>> {
    Ok(match newest(store, fp).await? {
        Some((_, Some(info))) if !info.lapsed() => Some(info),
        _ => None,
    })
}

/// Try to take the lease of `fp` for `run_id`/`instance`.
pub async fn try_acquire(store: &Store, fp: &str, run_id: &str, instance: &str) -> StoreResult<Acquired> {
    let ttl = ttl();
    let next = match newest(store, fp).await? {
        None => 1,
        Some((_, Some(info))) if !info.lapsed() => return Ok(Acquired::Busy(info)),
        Some((generation, _)) => generation + 1,
    };
    let info = LeaseInfo {
        host: host_name(),
        pid: std::process::id(),
        run_id: run_id.to_string(),
        instance: instance.to_string(),
        expires_at: now_secs() + ttl.as_secs_f64(),
        pid_space: pid_space().to_string(),
    };
    let key = generation_key(fp, next);
    let body = bytes::Bytes::from(serde_json::to_vec(&info).expect("a lease serialises"));
    if !store.put_if_absent(&key, body).await? {
        // Another waiter took this generation first.
        let holder = read_lease(store, &key).await.ok().flatten().unwrap_or(info);
        return Ok(Acquired::Busy(holder));
    }
    // Older generations are history now.
    for g in (next.saturating_sub(3)..next).filter(|g| *g > 0) {
        let _ = store.delete(&generation_key(fp, g)).await;
    }
    let renewer = tokio::spawn(renew(store.clone(), fp.to_string(), next, key.clone(), info, ttl));
    Ok(Acquired::Held(LeaseGuard { store: store.clone(), key, renewer }))
}

async fn renew(store: Store, fp: String, generation: u64, key: String, mut info: LeaseInfo, ttl: Duration) {
    // Every ttl / 4 from the start of the last renewal, writing first: a store that answers
    // slowly (seconds, on a loaded machine) lets a live holder's lease lapse only when one write
    // takes half the ttl (checking first, as before, made that two reads and a write in 2/3).
    let period = ttl / 4;
    let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        info.expires_at = now_secs() + ttl.as_secs_f64();
        let _ = store.put_json(&key, &info).await;
        // A newer generation means ours lapsed and was taken over: stop, and take back the write
        // just made. Publishing stays safe (the manifest is written once), so the stage is
        // allowed to finish.
        if let Ok(Some((newest, _))) = newest(&store, &fp).await
            && newest != generation
        {
            let _ = store.delete(&key).await;
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;

    use futures::stream::BoxStream;
    use object_store::path::Path;
    use object_store::{
        CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, PutMultipartOptions, PutOptions, PutPayload, PutResult,
    };

    use super::*;

    #[tokio::test]
    async fn one_holder_at_a_time_and_a_released_lease_is_free() {
        let store = Store::open("memory://", std::path::Path::new(".")).unwrap();
        let fp = "00112233445566778899aabbccddeeff";
        let Acquired::Held(first) = try_acquire(&store, fp, "run-1", "a").await.unwrap() else { panic!("free lease not taken") };
        match try_acquire(&store, fp, "run-2", "a").await.unwrap() {
            Acquired::Busy(info) => assert_eq!(info.run_id, "run-1"),
            Acquired::Held(_) => panic!("two holders"),
        }
        first.release().await;
        assert!(matches!(try_acquire(&store, fp, "run-2", "a").await.unwrap(), Acquired::Held(_)));
    }

    #[tokio::test]
    async fn a_lapsed_lease_is_taken_over_by_exactly_one_waiter() {
        let store = Store::open("memory://", std::path::Path::new(".")).unwrap();
        let fp = "00112233445566778899aabbccddeeff";
        let dead = LeaseInfo {
            host: "elsewhere".into(),
            pid: 1,
            run_id: "old".into(),
            instance: "a".into(),
            expires_at: now_secs() - 1.0,
            pid_space: String::new(),
        };
        store.put_json(&generation_key(fp, 7), &dead).await.unwrap();
        let (a, b) = tokio::join!(try_acquire(&store, fp, "run-a", "a"), try_acquire(&store, fp, "run-b", "a"));
        let held = [a.unwrap(), b.unwrap()].into_iter().filter(|x| matches!(x, Acquired::Held(_))).count();
        assert_eq!(held, 1);
    }

    /// An in-memory store whose next `failures` reads of a lease object fail, as a read that a
    /// server drops half-way does (object_store retries a refused request, not a broken body).
    #[derive(Debug, Default)]
    struct FailingLeaseReads {
        inner: object_store::memory::InMemory,
        failures: std::sync::atomic::AtomicUsize,
    }

    impl std::fmt::Display for FailingLeaseReads {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("FailingLeaseReads")
        }
    }

    #[async_trait::async_trait]
    impl object_store::ObjectStore for FailingLeaseReads {
        async fn put_opts(&self, at: &Path, payload: PutPayload, opts: PutOptions) -> object_store::Result<PutResult> {
            self.inner.put_opts(at, payload, opts).await
        }
        async fn put_multipart_opts(&self, at: &Path, opts: PutMultipartOptions) -> object_store::Result<Box<dyn MultipartUpload>> {
            self.inner.put_multipart_opts(at, opts).await
        }
        async fn get_opts(&self, at: &Path, options: GetOptions) -> object_store::Result<GetResult> {
            let fail = at.as_ref().starts_with("leases/")
                && self.failures.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok();
            if fail {
                return Err(object_store::Error::Generic { store: "test", source: "connection reset by peer".into() });
            }
            self.inner.get_opts(at, options).await
        }
        fn delete_stream(&self, at: BoxStream<'static, object_store::Result<Path>>) -> BoxStream<'static, object_store::Result<Path>> {
            self.inner.delete_stream(at)
        }
        fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
            self.inner.list(prefix)
        }
        async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
            self.inner.list_with_delimiter(prefix).await
        }
        async fn copy_opts(&self, from: &Path, to: &Path, options: CopyOptions) -> object_store::Result<()> {
            self.inner.copy_opts(from, to, options).await
        }
    }

    #[tokio::test]
    async fn a_live_lease_that_cannot_be_read_is_not_taken_over() {
        let failing = std::sync::Arc::new(FailingLeaseReads::default());
        let store = Store::over(failing.clone());
        let fp = "00112233445566778899aabbccddeeff";
        let Acquired::Held(_first) = try_acquire(&store, fp, "run-1", "a").await.unwrap() else { panic!("free lease not taken") };
        // A read or two that fail, then succeed: the holder is seen.
        failing.failures.store(READ_TRIES as usize - 1, Ordering::SeqCst);
        match try_acquire(&store, fp, "run-2", "a").await.unwrap() {
            Acquired::Busy(info) => assert_eq!(info.run_id, "run-1"),
            Acquired::Held(_) => panic!("a live lease was taken over after a failed read"),
        }
        // Reads that keep failing: an error, never a second holder.
        failing.failures.store(usize::MAX, Ordering::SeqCst);
        match try_acquire(&store, fp, "run-3", "a").await {
            Err(e) => assert!(e.to_string().contains("connection reset"), "{e}"),
            Ok(Acquired::Held(_)) => panic!("a live lease was taken over because it could not be read"),
            Ok(Acquired::Busy(_)) => panic!("a holder read from a store that fails every read"),
        }
    }

    #[test]
    fn a_holder_in_another_pid_namespace_of_the_same_host_is_not_taken_for_gone() {
        // No process has this id here; the lease has not expired.
        let lease = |pid_space: &str| LeaseInfo {
            host: host_name(),
            pid: 4_000_000_000,
            run_id: "r".into(),
            instance: "a".into(),
            expires_at: now_secs() + 60.0,
            pid_space: pid_space.into(),
        };
        if pid_space().is_empty() || !cfg!(target_os = "linux") {
            return; // nothing to tell namespaces apart by here
        }
        assert!(!lease("pid:[1]").lapsed(), "a container sharing the host name is not this one");
        assert!(lease(pid_space()).lapsed(), "a process of this namespace that is gone");
        assert!(lease("").lapsed(), "an older lease, without a namespace: by host name as before");
    }

    #[tokio::test]
    async fn a_lease_no_holder_wrote_does_not_block_the_stage() {
        let store = Store::open("memory://", std::path::Path::new(".")).unwrap();
        let fp = "00112233445566778899aabbccddeeff";
        // Expiring in 10^308 s, on a host that is not this one: never renewed like that.
        let forged = LeaseInfo {
            host: "elsewhere".into(),
            pid: 1,
            run_id: "x".into(),
            instance: "a".into(),
            expires_at: 1e308,
            pid_space: String::new(),
        };
        store.put_json(&generation_key(fp, 5), &forged).await.unwrap();
        // A generation no acquisition reaches (the next one would overflow), holding no lease.
        store.put(&generation_key(fp, u64::MAX), bytes::Bytes::from_static(b"x")).await.unwrap();
        assert!(matches!(try_acquire(&store, fp, "run-1", "a").await.unwrap(), Acquired::Held(_)));
    }

    #[test]
    fn a_holder_that_exited_but_was_never_reaped_is_gone() {
        if !cfg!(target_os = "linux") {
            return;
        }
        let mut child = std::process::Command::new("sh").args(["-c", "exit 0"]).spawn().unwrap();
        let pid = child.id();
        // Not waited for: once it has exited it is a zombie, still listed under /proc.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !process_is_gone(pid) && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert!(std::path::Path::new(&format!("/proc/{pid}")).exists(), "still listed: a zombie");
        assert!(process_is_gone(pid), "an exited, unreaped process counts as gone");
        child.wait().unwrap();
        assert!(!process_is_gone(std::process::id()), "this process is alive");
    }
}
