//! Several GPUs: one [`Engine`] (one worker process, one CUDA context) per selected device,
//! and a scheduler that hands independent work items to whichever device is free.
//!
//! The unit of scheduling is a whole work item (for `cargo kopt optimize`, one kernel's
//! agent loop): an item runs on one device from its first evaluation to its last, so
//! every timing comparison it makes (reference against candidate, candidate against the
//! best so far) is made on one device, and its result is what a one-device run would
//! give, up to timing noise. Items are taken in the order given; results come back in
//! that order whichever device finished first.

use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Mutex};
use std::time::{Duration, Instant};

use crate::engine::Engine;
use crate::parent::WorkerFailure;
use crate::protocol::DeviceInfo;

/// `--devices`: `all`, or GPU ordinals separated by commas (`0,1,3`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceSelection {
    All,
    Ordinals(Vec<usize>),
}

impl FromStr for DeviceSelection {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let s = s.trim();
        if s == "all" {
            return Ok(DeviceSelection::All);
        }
        let mut ordinals = Vec::new();
        for part in s.split(',') {
            let part = part.trim();
            let n = part.parse::<usize>().map_err(|_| {
                format!("`--devices {s}`: `{part}` is not a GPU ordinal; write `all` or ordinals such as `0,1`")
            })?;
            if ordinals.contains(&n) {
                return Err(format!("`--devices {s}`: GPU {n} is named twice"));
            }
            ordinals.push(n);
        }
        Ok(DeviceSelection::Ordinals(ordinals))
    }
}

impl DeviceSelection {
    /// The ordinals selected on a machine with `count` devices, checked.
    pub fn resolve(&self, count: usize) -> Result<Vec<usize>, String> {
        if count == 0 {
            return Err("no GPU found: `--devices` has nothing to choose from".into());
        }
        match self {
            DeviceSelection::All => Ok((0..count).collect()),
            DeviceSelection::Ordinals(v) => {
                if let Some(bad) = v.iter().find(|&&n| n >= count) {
                    return Err(format!(
                        "GPU {bad} does not exist: this machine has {count} (ordinals 0 to {}); `cargo kopt devices` lists them",
                        count - 1
                    ));
                }
                Ok(v.clone())
            }
        }
    }
}

/// One engine per device.
pub struct DevicePool {
    engines: Vec<(usize, Engine)>,
}

/// A work item's result, with where and when it ran (offsets from the start of
/// [`DevicePool::try_map`]).
#[derive(Debug, Clone)]
pub struct Scheduled<R> {
    pub value: R,
    pub device: usize,
    pub started: Duration,
    pub finished: Duration,
}

/// What a work item is given: its device's ordinal and engine, and a progress sink
/// (messages reach the caller's progress callback on the calling thread).
pub struct Slot<'a> {
    pub ordinal: usize,
    pub engine: &'a mut Engine,
    pub progress: &'a dyn Fn(&str),
}

impl DevicePool {
    /// `engines`: (ordinal, engine) pairs, one per device. Panics on an empty list (a pool
    /// runs somewhere).
    pub fn new(engines: Vec<(usize, Engine)>) -> Self {
        assert!(!engines.is_empty(), "a device pool needs a device");
        DevicePool { engines }
    }

    pub fn len(&self) -> usize {
        self.engines.len()
    }

    pub fn is_empty(&self) -> bool {
        self.engines.is_empty()
    }

    pub fn ordinals(&self) -> Vec<usize> {
        self.engines.iter().map(|(o, _)| *o).collect()
    }

    pub fn engines_mut(&mut self) -> impl Iterator<Item = (usize, &mut Engine)> {
        self.engines.iter_mut().map(|(o, e)| (*o, e))
    }

    /// Starts every worker and returns each device's description, in pool order.
    pub fn devices(&mut self) -> Result<Vec<DeviceInfo>, WorkerFailure> {
        self.engines.iter_mut().map(|(_, e)| e.device()).collect()
    }

    /// Runs `work` on every item, each on one device, the devices in parallel (one thread
    /// each; with one device, one thread, in the items' order exactly as a plain loop).
    /// After an item fails no device starts another; the error returned is the failed
    /// item's of lowest index. Results come back in the items' order.
    pub fn try_map<T, R, E>(
        &mut self,
        items: &[T],
        work: impl Fn(Slot<'_>, &T) -> Result<R, E> + Sync,
        progress: &mut dyn FnMut(&str),
    ) -> Result<Vec<Scheduled<R>>, E>
    where
        T: Sync,
        R: Send,
        E: Send,
    {
        let next = AtomicUsize::new(0);
        let failed = AtomicBool::new(false);
        let start = Instant::now();
        type Done<R, E> = Vec<(usize, Result<Scheduled<R>, E>)>;
        let (tx, rx) = mpsc::channel::<String>();
        let done: Mutex<Done<R, E>> = Mutex::new(Vec::new());
        std::thread::scope(|scope| {
            for (ordinal, engine) in self.engines.iter_mut() {
                let tx = tx.clone();
                let (next, failed, work, done) = (&next, &failed, &work, &done);
                let ordinal = *ordinal;
                scope.spawn(move || {
                    let sink = move |m: &str| {
                        let _ = tx.send(m.to_string());
                    };
                    while !failed.load(Ordering::SeqCst) {
                        let i = next.fetch_add(1, Ordering::SeqCst);
                        let Some(item) = items.get(i) else { break };
                        let started = start.elapsed();
                        let r = work(
                            Slot {
                                ordinal,
                                engine: &mut *engine,
                                progress: &sink,
                            },
                            item,
                        );
                        let finished = start.elapsed();
                        if r.is_err() {
                            failed.store(true, Ordering::SeqCst);
                        }
                        let r = r.map(|value| Scheduled {
                            value,
                            device: ordinal,
                            started,
                            finished,
                        });
                        done.lock().unwrap_or_else(|p| p.into_inner()).push((i, r));
                    }
                });
            }
            drop(tx);
            // Every sender is gone once every device's thread has finished.
            for m in rx {
                progress(&m);
            }
        });
        let mut done = done.into_inner().unwrap_or_else(|p| p.into_inner());
        done.sort_by_key(|(i, _)| *i);
        done.into_iter().map(|(_, r)| r).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_selections_parse_and_resolve() {
        assert_eq!("all".parse(), Ok(DeviceSelection::All));
        assert_eq!(" 1, 0 ".parse(), Ok(DeviceSelection::Ordinals(vec![1, 0])));
        assert_eq!(DeviceSelection::All.resolve(3).unwrap(), vec![0, 1, 2]);
        assert_eq!(
            DeviceSelection::Ordinals(vec![2, 0]).resolve(3).unwrap(),
            vec![2, 0]
        );
        let e = "0,x".parse::<DeviceSelection>().unwrap_err();
        assert!(e.contains("`x` is not a GPU ordinal"), "{e}");
        let e = "1,1".parse::<DeviceSelection>().unwrap_err();
        assert!(e.contains("GPU 1 is named twice"), "{e}");
        let e = DeviceSelection::Ordinals(vec![0, 2])
            .resolve(2)
            .unwrap_err();
        assert!(
            e.contains("GPU 2 does not exist: this machine has 2"),
            "{e}"
        );
        assert!(DeviceSelection::All
            .resolve(0)
            .unwrap_err()
            .contains("no GPU found"));
    }
}
