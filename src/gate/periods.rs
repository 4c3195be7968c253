//! Counts that outlive a session: a budget with a period (`budget = HOST 20m/day`) is one count
//! for every session of the project in the window, so that ending a sandbox and starting the
//! next does not give an agent its budget anew. The gate keeps the count in memory (the
//! sessions' allowances take from it, as from a session's own) and in the project's state
//! directory (`budgets.json`, which no sandbox can reach), so it outlives the gate as well, which
//! exits when idle. A count is merged into the file under a lock: what this gate sent since its
//! last merge is added to what the file holds, and what another gate added (two gates run side by
//! side during a hand-over) comes back into this one's count, so gates add up, never overwrite
//! (docs/adr/0069). Merged once a second, when a session ends, and when the gate exits.

use crate::policy::budget::Period;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Every project's counts this gate has opened, by file.
#[derive(Default)]
pub(crate) struct Periods(Mutex<HashMap<PathBuf, Arc<Counts>>>);

impl Periods {
    /// The counts kept in `file`: read on first use, then shared by every session naming it. A
    /// file that does not read is an error (the session is refused: a count it cannot trust
    /// would start from nothing).
    pub(crate) fn open(&self, file: &Path) -> Result<Arc<Counts>, String> {
        let mut all = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = all.get(file) {
            return Ok(c.clone());
        }
        let c = Arc::new(Counts::load(file)?);
        all.insert(file.to_path_buf(), c.clone());
        Ok(c)
    }

    /// Merges every project's counts into its file. What fails is said on the gate's stderr;
    /// the counts go on in memory.
    pub(crate) fn merge_all(&self) {
        let all: Vec<Arc<Counts>> =
            self.0.lock().unwrap_or_else(|e| e.into_inner()).values().cloned().collect();
        for c in all {
            if let Err(e) = c.merge(now()) {
                eprintln!("gate: {e}");
            }
        }
    }
}

pub(crate) fn now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

/// One project's counts.
pub(crate) struct Counts {
    file: PathBuf,
    windows: Mutex<HashMap<(String, Period), Window>>,
}

/// A count in its window: `sent` is what the allowances take from, `merged` what it was when
/// last merged with the file (what the file held then).
struct Window {
    window: u64,
    sent: Arc<AtomicU64>,
    merged: u64,
}

impl Window {
    fn new(window: u64, sent: u64) -> Window {
        Window { window, sent: Arc::new(AtomicU64::new(sent)), merged: sent }
    }
}

/// One count as the file holds it.
#[derive(serde::Serialize, serde::Deserialize)]
struct Stored {
    key: String,
    period: Period,
    window: u64,
    sent: u64,
}

#[derive(Default, serde::Serialize, serde::Deserialize)]
struct Ledger {
    counts: Vec<Stored>,
}

impl Counts {
    fn load(file: &Path) -> Result<Counts, String> {
        let stored = read(file)?;
        let windows =
            stored.counts.into_iter().map(|s| ((s.key, s.period), Window::new(s.window, s.sent))).collect();
        Ok(Counts { file: file.to_path_buf(), windows: Mutex::new(windows) })
    }

    /// The count for `key` over `period` in the window of `now`: a new window starts at 0.
    pub(crate) fn count(&self, key: &str, period: Period, now: u64) -> Arc<AtomicU64> {
        let w = period.window(now);
        let mut all = self.windows.lock().unwrap_or_else(|e| e.into_inner());
        let e = all.entry((key.to_string(), period)).or_insert_with(|| Window::new(w, 0));
        // A later window than the clock's (the clock was set back) is kept: never counted anew.
        if e.window < w {
            *e = Window::new(w, 0);
        }
        e.sent.clone()
    }

    /// Adds what was sent since the last merge to the file's counts, under the project's lock,
    /// and takes what other gates added into this one's. Windows past are dropped from the file.
    pub(crate) fn merge(&self, now: u64) -> Result<(), String> {
        let lock = self.file.with_extension("lock");
        if let Some(dir) = self.file.parent() {
            use std::os::unix::fs::DirBuilderExt;
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .map_err(|e| format!("budget counts: making {}: {e}", dir.display()))?;
        }
        let f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock)
            .map_err(|e| format!("budget counts: opening {}: {e}", lock.display()))?;
        let _held = nix::fcntl::Flock::lock(f, nix::fcntl::FlockArg::LockExclusive)
            .map_err(|(_, e)| format!("budget counts: locking {}: {e}", lock.display()))?;
        let mut on_file = read(&self.file)?;
        let mut all = self.windows.lock().unwrap_or_else(|e| e.into_inner());
        let mut changed = false;
        // Windows past are done with: forgotten here, dropped from the file below.
        all.retain(|(_, period), w| w.window >= period.window(now));
        for ((key, period), w) in all.iter_mut() {
            let stored = on_file.counts.iter_mut().find(|s| &s.key == key && s.period == *period);
            let theirs = match &stored {
                Some(s) if s.window == w.window => s.sent,
                Some(s) if s.window > w.window => continue,
                _ => 0,
            };
            let now_sent = w.sent.load(Ordering::Acquire);
            let mine = now_sent.saturating_sub(w.merged);
            // Others' bytes since the last merge join this gate's count.
            let others = theirs.saturating_sub(w.merged);
            let total = theirs.max(w.merged) + mine;
            w.sent.fetch_add(others, Ordering::AcqRel);
            w.merged = total;
            match stored {
                Some(s) if s.sent == total && s.window == w.window => {}
                Some(s) => {
                    (s.sent, s.window) = (total, w.window);
                    changed = true;
                }
                None => {
                    on_file.counts.push(Stored {
                        key: key.clone(),
                        period: *period,
                        window: w.window,
                        sent: total,
                    });
                    changed = true;
                }
            }
        }
        drop(all);
        let before = on_file.counts.len();
        on_file.counts.retain(|s| s.window >= s.period.window(now));
        if !changed && on_file.counts.len() == before {
            return Ok(());
        }
        on_file.counts.sort_by(|a, b| (&a.key, a.period).cmp(&(&b.key, b.period)));
        write(&self.file, &on_file)
    }
}

fn read(file: &Path) -> Result<Ledger, String> {
    match std::fs::read(file) {
        Ok(b) => serde_json::from_slice(&b).map_err(|e| {
            format!(
                "the budget counts in {} do not read ({e}); remove the file to count from 0",
                file.display()
            )
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Ledger::default()),
        Err(e) => Err(format!("budget counts: reading {}: {e}", file.display())),
    }
}

/// A new file renamed over the old one: a reader never sees half of it.
fn write(file: &Path, s: &Ledger) -> Result<(), String> {
    let dir = file.parent().unwrap_or(Path::new("."));
    let fail = |e: &dyn std::fmt::Display| format!("budget counts: writing {}: {e}", file.display());
    let mut tmp = tempfile::NamedTempFile::new_in(dir).map_err(|e| fail(&e))?;
    serde_json::to_writer_pretty(&mut tmp, s).map_err(|e| fail(&e))?;
    tmp.persist(file).map_err(|e| fail(&e.error))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contract::session::BUDGET_COUNTS as FILE;

    const DAY: u64 = 86400;

    #[test]
    fn a_count_outlives_its_gate_and_two_gates_add_up_without_overwriting() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("p").join(FILE);
        let t = 20_000 * DAY + 5;
        let a = Counts::load(&file).unwrap();
        a.count("up.test", Period::Day, t).fetch_add(100, Ordering::AcqRel);
        a.merge(t).unwrap();
        // A second gate (a hand-over) reads what the first merged, and both go on counting.
        let b = Counts::load(&file).unwrap();
        assert_eq!(b.count("up.test", Period::Day, t).load(Ordering::Acquire), 100, "read from the file");
        b.count("up.test", Period::Day, t).fetch_add(30, Ordering::AcqRel);
        a.count("up.test", Period::Day, t).fetch_add(7, Ordering::AcqRel);
        b.merge(t).unwrap();
        a.merge(t).unwrap();
        assert_eq!(
            a.count("up.test", Period::Day, t).load(Ordering::Acquire),
            137,
            "the other's bytes joined"
        );
        b.merge(t).unwrap();
        assert_eq!(b.count("up.test", Period::Day, t).load(Ordering::Acquire), 137);
        assert_eq!(
            Counts::load(&file).unwrap().count("up.test", Period::Day, t).load(Ordering::Acquire),
            137
        );
        // Another period of the same host is another count.
        assert_eq!(a.count("up.test", Period::Hour, t).load(Ordering::Acquire), 0);
        let mode = std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&file).unwrap().permissions());
        assert_eq!(mode & 0o077, 0, "the user's alone");
    }

    #[test]
    fn every_projects_counts_reach_their_files_in_one_merge_at_the_clocks_time() {
        let dir = tempfile::tempdir().unwrap();
        let periods = Periods::default();
        let (a, b) = (dir.path().join("a").join(FILE), dir.path().join("b").join(FILE));
        let t = now();
        let wall = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
        assert!(t.abs_diff(wall) <= 2 && t > 1_700_000_000, "the clock's seconds: {t}");
        periods.open(&a).unwrap().count("a.test", Period::Day, t).fetch_add(5, Ordering::AcqRel);
        periods.open(&b).unwrap().count("b.test", Period::Week, t).fetch_add(7, Ordering::AcqRel);
        periods.merge_all();
        let read = |f: &Path, key: &str, p: Period| {
            Counts::load(f).unwrap().count(key, p, t).load(Ordering::Acquire)
        };
        assert_eq!((read(&a, "a.test", Period::Day), read(&b, "b.test", Period::Week)), (5, 7));
    }

    #[test]
    fn a_new_window_counts_from_nothing_and_the_past_leaves_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join(FILE);
        let t = 20_000 * DAY + DAY - 1;
        let a = Counts::load(&file).unwrap();
        let old = a.count("up.test", Period::Day, t);
        old.fetch_add(500, Ordering::AcqRel);
        a.count("other.test", Period::Week, t).fetch_add(9, Ordering::AcqRel);
        a.merge(t).unwrap();
        let next = t + 1;
        assert_eq!(a.count("up.test", Period::Day, next).load(Ordering::Acquire), 0, "the next day");
        a.count("up.test", Period::Day, next).fetch_add(3, Ordering::AcqRel);
        assert_eq!(a.count("other.test", Period::Week, next).load(Ordering::Acquire), 9, "the same week");
        a.merge(next).unwrap();
        let text = std::fs::read_to_string(&file).unwrap();
        assert!(!text.contains("500"), "the past day's count is dropped: {text}");
        assert!(text.contains("other.test"), "{text}");
        let back = Counts::load(&file).unwrap();
        assert_eq!(
            back.count("up.test", Period::Day, next).load(Ordering::Acquire),
            3,
            "the new day's, on file"
        );
        // The clock set back finds the later window kept, not a fresh one.
        assert_eq!(a.count("other.test", Period::Week, t - 8 * DAY).load(Ordering::Acquire), 9);
    }

    #[test]
    fn counts_of_one_host_over_two_periods_are_apart_and_a_later_window_on_file_is_kept() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join(FILE);
        let t = 20_000 * DAY + 5;
        let a = Counts::load(&file).unwrap();
        a.count("up.test", Period::Day, t).fetch_add(11, Ordering::AcqRel);
        a.count("up.test", Period::Hour, t).fetch_add(22, Ordering::AcqRel);
        a.count("other.test", Period::Day, t).fetch_add(33, Ordering::AcqRel);
        a.merge(t).unwrap();
        // Nothing new: the file is left as it is (each write is a new file renamed over it).
        let inode = || std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&file).unwrap());
        let first = inode();
        a.merge(t).unwrap();
        assert_eq!(inode(), first, "rewritten with nothing new");
        let back = Counts::load(&file).unwrap();
        let got = |k: &str, p: Period| back.count(k, p, t).load(Ordering::Acquire);
        assert_eq!(
            (got("up.test", Period::Day), got("up.test", Period::Hour), got("other.test", Period::Day)),
            (11, 22, 33)
        );
        // Another gate already in the next day (this one's clock read just before midnight): its
        // count is kept, not overwritten by this gate's older window.
        let b = Counts::load(&file).unwrap();
        b.count("up.test", Period::Day, t + DAY).fetch_add(7, Ordering::AcqRel);
        b.merge(t + DAY).unwrap();
        a.count("up.test", Period::Day, t).fetch_add(1, Ordering::AcqRel);
        a.merge(t).unwrap();
        let later = Counts::load(&file).unwrap();
        assert_eq!(later.count("up.test", Period::Day, t + DAY).load(Ordering::Acquire), 7);
    }

    #[test]
    fn a_file_that_does_not_read_refuses_and_is_never_overwritten() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join(FILE);
        std::fs::write(&file, "{not json").unwrap();
        let e = Counts::load(&file).err().unwrap();
        assert!(e.contains("do not read") && e.contains("remove the file"), "{e}");
        let periods = Periods::default();
        assert!(periods.open(&file).is_err());
        std::fs::write(&file, "{\"counts\":[]}").unwrap();
        let c = periods.open(&file).unwrap();
        assert!(Arc::ptr_eq(&c, &periods.open(&file).unwrap()), "one count per file, shared");
        c.count("a.test", Period::Hour, 7200).fetch_add(1, Ordering::AcqRel);
        std::fs::write(&file, "{not json").unwrap();
        assert!(c.merge(7200).is_err());
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "{not json", "left as it was");
        // A file that cannot be read at all is not a count of 0 either.
        let odd = dir.path().join("odd");
        std::fs::create_dir(&odd).unwrap();
        let e = Counts::load(&odd).err().unwrap();
        assert!(e.starts_with("budget counts: reading"), "{e}");
    }
}
