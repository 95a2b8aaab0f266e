//! Rounds of batched policy calls with deterministic environment steps.
//!
//! Every live node is its own tokio task. A round starts once every active node (of every tree
//! in flight) has asked for its next action: the policy answers the whole batch at once. The
//! nodes then apply their actions to the shared world one at a time, in the fixed order of
//! (tree, node path): concurrency without races, and the same seed gives the same trees.

use std::sync::Arc;

use parking_lot::Mutex;

use tokio::sync::{Notify, oneshot};

use crate::policy::{Policy, Request, Response};

/// Where a node waits for its response (and the round it came in).
type Reply = oneshot::Sender<(Response, u64)>;

/// Orders requests within a round: (tree index, path of child indices from the root).
pub type NodeKey = (usize, Vec<u32>);

struct Pending {
    key: NodeKey,
    request: Request,
    reply: oneshot::Sender<(Response, u64)>,
}

struct State {
    active: usize,
    pending: Vec<Pending>,
    closed: bool,
    /// Sizes of the rounds served so far (for statistics).
    rounds: Vec<usize>,
}

/// Whose turn it is, and who waits for a later one (each waiter is woken alone: no herd).
struct Turns {
    current: u64,
    waiters: std::collections::HashMap<u64, oneshot::Sender<()>>,
}

struct Inner {
    policy: Arc<dyn Policy>,
    state: Mutex<State>,
    changed: Notify,
    turns: Mutex<Turns>,
    /// Wakes the driver when a turn ends.
    turn_ended: Notify,
}

/// A handle shared by every node task.
#[derive(Clone)]
pub struct Batcher {
    inner: Arc<Inner>,
}

impl Batcher {
    /// Start the round driver on the current tokio runtime.
    pub fn start(policy: Arc<dyn Policy>) -> Batcher {
        let inner = Arc::new(Inner {
            policy,
            state: Mutex::new(State { active: 0, pending: Vec::new(), closed: false, rounds: Vec::new() }),
            changed: Notify::new(),
            turns: Mutex::new(Turns { current: 0, waiters: Default::default() }),
            turn_ended: Notify::new(),
        });
        tokio::spawn(drive(inner.clone()));
        Batcher { inner }
    }

    pub fn policy_version(&self) -> i32 {
        self.inner.policy.version()
    }

    /// Nodes that will ask for actions (call before their tasks start, or inside a turn).
    pub fn activate(&self, n: usize) {
        self.inner.state.lock().active += n;
        self.inner.changed.notify_one();
    }

    /// Nodes that stopped asking (finished, or waiting for children).
    pub fn deactivate(&self, n: usize) {
        let mut s = self.inner.state.lock();
        s.active -= n;
        drop(s);
        self.inner.changed.notify_one();
    }

    /// Ask for the next action; returns it with this node's turn ticket.
    pub async fn request(&self, key: NodeKey, request: Request) -> (Response, u64) {
        let (tx, rx) = oneshot::channel();
        self.inner.state.lock().pending.push(Pending { key, request, reply: tx });
        self.inner.changed.notify_one();
        rx.await.expect("the batcher stopped while a node was waiting")
    }

    /// Wait until it is this ticket's turn to touch the world.
    pub async fn wait_turn(&self, ticket: u64) {
        let rx = {
            let mut t = self.inner.turns.lock();
            if t.current == ticket {
                return;
            }
            let (tx, rx) = oneshot::channel();
            t.waiters.insert(ticket, tx);
            rx
        };
        rx.await.expect("turn waiter dropped");
    }

    pub fn end_turn(&self, ticket: u64) {
        let mut t = self.inner.turns.lock();
        t.current = ticket + 1;
        if let Some(next) = t.waiters.remove(&(ticket + 1)) {
            let _ = next.send(());
        }
        drop(t);
        self.inner.turn_ended.notify_one();
    }

    /// Stop the driver once no node is active.
    pub fn close(&self) {
        self.inner.state.lock().closed = true;
        self.inner.changed.notify_one();
    }

    /// Sizes of every round so far.
    pub fn round_sizes(&self) -> Vec<usize> {
        self.inner.state.lock().rounds.clone()
    }
}

async fn drive(inner: Arc<Inner>) {
    let mut next_ticket = 0u64;
    loop {
        // Wait for every active node to ask.
        let batch = loop {
            let notified = inner.changed.notified();
            {
                let mut s = inner.state.lock();
                if s.active > 0 && s.pending.len() == s.active {
                    let mut b = std::mem::take(&mut s.pending);
                    s.rounds.push(b.len());
                    b.sort_by(|x, y| x.key.cmp(&y.key));
                    break b;
                }
                if s.active == 0 && s.pending.is_empty() && s.closed {
                    return;
                }
            }
            notified.await;
        };
        let (requests, replies): (Vec<Request>, Vec<(NodeKey, Reply)>) = batch.into_iter().map(|p| (p.request, (p.key, p.reply))).unzip();
        let n = requests.len() as u64;
        let responses = inner.policy.act(requests).await;
        assert_eq!(responses.len() as u64, n, "the policy must answer every request");
        let base = next_ticket;
        for (k, (resp, (_, reply))) in responses.into_iter().zip(replies).enumerate() {
            let _ = reply.send((resp, base + k as u64));
        }
        next_ticket += n;
        // The round ends when every node of it has taken its turn.
        loop {
            let ended = inner.turn_ended.notified();
            if inner.turns.lock().current >= next_ticket {
                break;
            }
            ended.await;
        }
    }
}
