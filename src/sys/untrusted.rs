//! Paths a sandbox could have made, handled on the host without trusting them.
//!
//! After a session the host reads, moves and rewrites files in the project, the sandbox HOME
//! and the agents' stores. Each path there was chosen by whatever ran inside, so a plain
//! `fs::read` is a way out: a link reads (or, written through, overwrites) any file of the
//! user's; a link as a directory above it does the same one level up; a fifo blocks the reader
//! for ever; a 50 GB file fills memory. A `Tree` is a directory opened once (the project, a
//! store: chosen by the user, trusted), and every path below it is reached from that descriptor
//! one component at a time, each opened with `O_NOFOLLOW` (no `..`, no absolute path), so a
//! link anywhere on the way is refused, never followed, and a rename on the way cannot move the
//! walk elsewhere. A file is opened `O_NONBLOCK` and read (or copied) only if `fstat` says it is
//! a regular file, up to a cap checked against what is read, not only against the length
//! `fstat` says (the sandbox's word, and the file may grow meanwhile), which sizes no buffer
//! past `PREALLOC_MAX`. Writes go to a new file (`O_EXCL`) renamed over the name, which replaces
//! a link or fifo there instead of writing through it.
//!
//! `openat2(RESOLVE_NO_SYMLINKS | RESOLVE_BENEATH)` would do the walk in one call on kernels
//! from 5.6; the component walk is the same guarantee on every kernel, in one code path.

use nix::dir::{Dir, Type as DirType};
use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag, openat, readlinkat, renameat};
use nix::sys::stat::{FileStat, Mode, SFlag, fchmod, fstat, fstatat, mkdirat};
use nix::unistd::{UnlinkatFlags, symlinkat, unlinkat};
use std::ffi::{OsStr, OsString};
use std::io::{self, Read};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, Mutex};

/// The most bytes of one file that `Tree::move_out` copies when the move crosses filesystems and
/// so must copy: the copy goes to the host's disk, and what the sandbox left may be a sparse file
/// of any length or one still growing. As much as review mode fetches of a sandbox's git objects
/// (`review::git::OBJECTS_MAX`), so that a pack file of a repository the sandbox put in place of
/// `.git` is still moved aside.
pub const MOVE_COPY_MAX: u64 = 8 << 30;

/// The most of the length `fstat` says that a read allocates before reading: past it the buffer
/// grows with what is read.
const PREALLOC_MAX: u64 = 64 << 10;

/// What is at a path (never what a link there leads to).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    File,
    Dir,
    Link,
    Fifo,
    Socket,
    Device,
}

impl Kind {
    /// How a report names it.
    pub fn name(self) -> &'static str {
        match self {
            Kind::File => "a file",
            Kind::Dir => "a directory",
            Kind::Link => "a symbolic link",
            Kind::Fifo => "a fifo",
            Kind::Socket => "a socket",
            Kind::Device => "a device",
        }
    }

    fn of_mode(mode: u32) -> Kind {
        match SFlag::from_bits_truncate(mode & SFlag::S_IFMT.bits()) {
            SFlag::S_IFREG => Kind::File,
            SFlag::S_IFDIR => Kind::Dir,
            SFlag::S_IFLNK => Kind::Link,
            SFlag::S_IFIFO => Kind::Fifo,
            SFlag::S_IFSOCK => Kind::Socket,
            _ => Kind::Device,
        }
    }
}

/// What `lstat` says of a path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stat {
    pub kind: Kind,
    /// Permission bits (`& 0o7777`).
    pub mode: u32,
    pub ino: u64,
    pub len: u64,
    pub uid: u32,
    /// Last status change and last modification, in nanoseconds since the epoch: ctime cannot
    /// be set by a program, so a ctime after a moment means the inode changed since.
    pub ctime_ns: u64,
    pub mtime_ns: u64,
    pub nlink: u64,
    /// The device number of a device (0/0 is an overlay's whiteout).
    pub rdev: u64,
}

impl Stat {
    fn of(st: &FileStat) -> Stat {
        Stat {
            kind: Kind::of_mode(st.st_mode),
            mode: st.st_mode & 0o7777,
            ino: st.st_ino,
            len: st.st_size as u64,
            uid: st.st_uid,
            ctime_ns: ns(st.st_ctime, st.st_ctime_nsec),
            mtime_ns: ns(st.st_mtime, st.st_mtime_nsec),
            nlink: st.st_nlink,
            rdev: st.st_rdev,
        }
    }
}

fn ns(secs: i64, nsec: i64) -> u64 {
    (secs.max(0) as u64).saturating_mul(1_000_000_000).saturating_add(nsec.max(0) as u64)
}

/// The error for a path that is there but not what may be read or entered (a link, a fifo...).
pub fn not_a(kind: Kind, wanted: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("{} where {wanted} was expected", kind.name()))
}

fn errno(e: Errno) -> io::Error {
    io::Error::from_raw_os_error(e as i32)
}

/// Whether an error means "nothing there to reach without following a link or leaving".
pub fn absent(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOENT) | Some(libc::ENOTDIR) | Some(libc::ELOOP))
        || e.kind() == io::ErrorKind::NotFound
}

/// How each kind of open is done, in one place: a directory on the way (never a link); the
/// tree's own root (chosen by the user); a file to read (never a link, never waiting on a fifo,
/// never becoming a terminal); a new file to write (only if nothing is there); a path to change
/// the mode of (no read permission needed).
const DIR_FLAGS: OFlag = OFlag::O_RDONLY
    .union(OFlag::O_DIRECTORY)
    .union(OFlag::O_NOFOLLOW)
    .union(OFlag::O_CLOEXEC)
    .union(OFlag::O_NONBLOCK);
const ROOT_FLAGS: OFlag = OFlag::O_RDONLY.union(OFlag::O_DIRECTORY).union(OFlag::O_CLOEXEC);
const READ_FLAGS: OFlag = OFlag::O_RDONLY
    .union(OFlag::O_NOFOLLOW)
    .union(OFlag::O_NONBLOCK)
    .union(OFlag::O_CLOEXEC)
    .union(OFlag::O_NOCTTY);
const NEW_FLAGS: OFlag = OFlag::O_WRONLY
    .union(OFlag::O_CREAT)
    .union(OFlag::O_EXCL)
    .union(OFlag::O_NOFOLLOW)
    .union(OFlag::O_CLOEXEC);
const PATH_FLAGS: OFlag = OFlag::O_PATH.union(OFlag::O_NOFOLLOW).union(OFlag::O_CLOEXEC);

/// A directory opened once; everything below it reached without following a link.
pub struct Tree {
    root: OwnedFd,
    path: PathBuf,
    /// The directory `parent` reached last, by its names: the files of one directory (`apply`
    /// and `diff` go through them in path order) cost one walk, not one each. It is never one
    /// this tree removed or moved: each operation that removes or moves a path walks to that
    /// path's parent first, which is then the one kept. A directory another program (or another
    /// `Tree`) renames meanwhile stays the one used until a walk to another directory, where
    /// it now is: the walk's guarantee (no link followed) holds for when it was made. A sandbox
    /// renames only within its own mounts, so a directory it moves stays where it could write.
    last: Mutex<Option<(Vec<OsString>, Arc<OwnedFd>)>>,
}

/// The names of a relative path, refused if it could leave the tree (`..`, absolute).
fn names(rel: &Path) -> io::Result<Vec<&OsStr>> {
    let mut out = Vec::new();
    for c in rel.components() {
        match c {
            Component::Normal(n) => out.push(n),
            Component::CurDir => {}
            _ => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("{} leaves the directory", crate::sys::quote::path(rel)),
                ));
            }
        }
    }
    Ok(out)
}

impl Tree {
    /// Opens `root` (a directory the user chose: it may itself be reached through a link).
    pub fn open(root: &Path) -> io::Result<Tree> {
        let fd = nix::fcntl::open(root, ROOT_FLAGS, Mode::empty()).map_err(errno)?;
        Ok(Tree { root: fd, path: root.to_path_buf(), last: Mutex::new(None) })
    }

    /// The root as the host names it.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The directory at `names`, each component opened without following a link.
    fn walk(&self, names: &[&OsStr]) -> io::Result<OwnedFd> {
        let mut fd = self.root.try_clone()?;
        for n in names {
            fd = openat(fd.as_fd(), *n, DIR_FLAGS, Mode::empty()).map_err(errno)?;
        }
        Ok(fd)
    }

    /// The directory holding `rel`, and `rel`'s last name.
    fn parent<'a>(&self, rel: &'a Path) -> io::Result<(Arc<OwnedFd>, &'a OsStr)> {
        let n = names(rel)?;
        let Some((last, above)) = n.split_last() else {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "the tree's root itself"));
        };
        let mut cached = self.last.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((at, fd)) = cached.as_ref()
            && at.iter().map(OsString::as_os_str).eq(above.iter().copied())
        {
            return Ok((fd.clone(), last));
        }
        let fd = Arc::new(self.walk(above)?);
        *cached = Some((above.iter().map(|n| n.to_os_string()).collect(), fd.clone()));
        Ok((fd, last))
    }

    /// What is at `rel` (None: nothing, or only through a link or a non-directory above it).
    pub fn stat(&self, rel: &Path) -> io::Result<Option<Stat>> {
        let (dir, name) = match self.parent(rel) {
            Ok(p) => p,
            Err(e) if absent(&e) => return Ok(None),
            Err(e) => return Err(e),
        };
        match fstatat(dir.as_fd(), name, AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(st) => Ok(Some(Stat::of(&st))),
            Err(Errno::ENOENT) | Err(Errno::ENOTDIR) => Ok(None),
            Err(e) => Err(errno(e)),
        }
    }

    /// The birth time of what is at `rel` in nanoseconds, where the filesystem keeps one
    /// (statx), else 0 (asked apart from `stat`: reading it costs a path lookup through
    /// `/proc/self/fd`, and one caller needs it).
    pub fn born(&self, rel: &Path) -> u64 {
        self.parent(rel).map_or(0, |(dir, name)| born(&dir, name))
    }

    /// The bytes of the regular file at `rel`, at most `cap` of them: a link, fifo, socket or
    /// device there is an error (`not_a`), as is a larger file; nothing blocks.
    pub fn read(&self, rel: &Path, cap: u64) -> io::Result<Vec<u8>> {
        let (f, st) = self.open_file(rel)?;
        // The bound is what is read, not what fstat said: a file that grows meanwhile is refused
        // too. What fstat said sizes the buffer up to PREALLOC_MAX only.
        let mut out = Vec::with_capacity(st.len.min(cap).min(PREALLOC_MAX) as usize);
        f.take(cap + 1).read_to_end(&mut out)?;
        if out.len() as u64 > cap {
            return Err(too_large(rel, cap));
        }
        Ok(out)
    }

    /// The regular file at `rel`, open for reading, and what `fstat` says of it (the opened
    /// file's own, not a name's): a link, fifo, socket or device there is an error (`not_a`).
    pub fn open_file(&self, rel: &Path) -> io::Result<(std::fs::File, Stat)> {
        let (dir, name) = self.parent(rel)?;
        let fd = match openat(dir.as_fd(), name, READ_FLAGS, Mode::empty()) {
            Ok(fd) => fd,
            // A socket cannot be opened; a link is refused by O_NOFOLLOW.
            Err(Errno::ELOOP) => return Err(not_a(Kind::Link, "a file")),
            Err(Errno::ENXIO) => return Err(not_a(Kind::Socket, "a file")),
            Err(e) => return Err(errno(e)),
        };
        let st = Stat::of(&fstat(fd.as_fd()).map_err(errno)?);
        if st.kind != Kind::File {
            return Err(not_a(st.kind, "a file"));
        }
        Ok((std::fs::File::from(fd), st))
    }

    /// The value of the extended attribute `name` of what is at `rel` (not followed), if set:
    /// read through the parent's `/proc/self/fd` entry, as `born` does.
    pub fn xattr(&self, rel: &Path, name: &str) -> io::Result<Option<Vec<u8>>> {
        use std::os::fd::AsRawFd;
        let (dir, last) = self.parent(rel)?;
        let p = Path::new("/proc/self/fd").join(dir.as_raw_fd().to_string()).join(last);
        let c = std::ffi::CString::new(p.as_os_str().as_bytes())?;
        let n = std::ffi::CString::new(name)?;
        let mut buf = vec![0u8; 256];
        // SAFETY: both strings are NUL-terminated; the buffer's length is passed.
        let got = unsafe { libc::lgetxattr(c.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
        if got < 0 {
            let e = io::Error::last_os_error();
            return match e.raw_os_error() {
                Some(libc::ENODATA) | Some(libc::ENOTSUP) => Ok(None),
                _ => Err(e),
            };
        }
        buf.truncate(got as usize);
        Ok(Some(buf))
    }

    /// The entries of the directory at `rel` ("" for the root), with what each is, sorted by
    /// name. A link or anything else that is not a directory at `rel` is an error.
    pub fn list(&self, rel: &Path) -> io::Result<Vec<(OsString, Kind)>> {
        let fd = self.open_dir(None, rel)?;
        entries(&fd)
    }

    /// The directory at `rel`, opened without following a link: from `parent` (the descriptor
    /// of `rel`'s parent directory, as a walk down the tree holds it: one `openat` per
    /// directory) or from the root. What is there instead of a directory is said.
    pub fn open_dir(&self, parent: Option<&OwnedFd>, rel: &Path) -> io::Result<OwnedFd> {
        let n = names(rel)?;
        let opened = match (parent, n.last()) {
            (Some(p), Some(last)) => openat(p.as_fd(), *last, DIR_FLAGS, Mode::empty()).map_err(errno),
            _ => self.walk(&n),
        };
        opened.map_err(|e| match self.stat(rel) {
            // O_NOFOLLOW with O_DIRECTORY gives ENOTDIR for a link: say what it is.
            Ok(Some(st)) if st.kind != Kind::Dir => not_a(st.kind, "a directory"),
            _ => e,
        })
    }

    /// Where a link at `rel` leads (its text, not followed).
    pub fn readlink(&self, rel: &Path) -> io::Result<PathBuf> {
        let (dir, name) = self.parent(rel)?;
        readlinkat(dir.as_fd(), name).map(PathBuf::from).map_err(errno)
    }

    /// Moves what is at `rel` (whatever it is, not followed) into `quarantine`, a directory of
    /// the host's (made 0700 if missing), at the same relative path, and returns where it went.
    /// Nothing below `quarantine` is followed either: what an earlier move put there (a link the
    /// sandbox made, a directory swapped in its place) is never a way elsewhere, and where the
    /// way is taken by something that is not a directory, or the place itself, the item goes
    /// below a fresh `.aside-N` instead (nothing in the quarantine is replaced). Across
    /// filesystems it is copied (files, directories, links; a fifo, socket or device is not
    /// carried) and removed; a file larger than `MOVE_COPY_MAX` is an error naming it, and then
    /// nothing is removed (what was copied before it stays in the quarantine).
    pub fn move_out(&self, rel: &Path, quarantine: &Path) -> io::Result<PathBuf> {
        std::os::unix::fs::DirBuilderExt::mode(std::fs::DirBuilder::new().recursive(true), 0o700)
            .create(quarantine)?;
        let q = Tree::open(quarantine)?;
        let mut to = rel.to_path_buf();
        for n in 1.. {
            let way = match to.parent().filter(|p| !p.as_os_str().is_empty()) {
                Some(p) => q.mkdir_all(p, 0o700),
                None => Ok(()),
            };
            if way.is_ok() && q.stat(&to)?.is_none() {
                break;
            }
            if n > 1000 {
                return Err(io::Error::other(format!(
                    "no free place in {} for {}",
                    quarantine.display(),
                    crate::sys::quote::path(rel)
                )));
            }
            to = Path::new(&format!(".aside-{n}")).join(rel);
        }
        let (dir, name) = self.parent(rel)?;
        let (qdir, qname) = q.parent(&to)?;
        match renameat(dir.as_fd(), name, qdir.as_fd(), qname) {
            Ok(()) => {}
            Err(Errno::EXDEV) => {
                self.copy_out(rel, &q, &to, MOVE_COPY_MAX)?;
                self.remove(rel)?;
            }
            Err(e) => return Err(errno(e)),
        }
        Ok(quarantine.join(to))
    }

    /// Renames `from` to `to`, both in the tree (neither name followed, `to` replaced if there).
    pub fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let (a, an) = self.parent(from)?;
        let (b, bn) = self.parent(to)?;
        renameat(a.as_fd(), an, b.as_fd(), bn).map_err(errno)
    }

    /// Copies what is at `rel` to `to` in the tree `dest` (nothing there yet), streamed: a file
    /// is copied as it is read, never held whole, and at most `max` bytes of each: a file longer
    /// (as `fstat` says, checked before a byte is read, or as it grows while read) is an error
    /// naming it, and nothing of it is left at `to`.
    fn copy_out(&self, rel: &Path, dest: &Tree, to: &Path, max: u64) -> io::Result<()> {
        let Some(st) = self.stat(rel)? else { return Ok(()) };
        match st.kind {
            Kind::File => {
                let (f, st) = self.open_file(rel)?;
                if st.len > max {
                    return Err(too_large_to_copy(rel, st.len, max));
                }
                dest.put(to, &mut Capped::new(f, max, rel), st.mode, Some(st.mtime_ns), false)?;
            }
            Kind::Dir => {
                dest.mkdir_all(to, 0o700)?;
                for (n, _) in self.list(rel)? {
                    self.copy_out(&rel.join(&n), dest, &to.join(&n), max)?;
                }
            }
            Kind::Link => dest.symlink(&self.readlink(rel)?, to)?,
            Kind::Fifo | Kind::Socket | Kind::Device => {}
        }
        Ok(())
    }

    /// Removes what is at `rel`, a directory with everything in it, never through a link.
    pub fn remove(&self, rel: &Path) -> io::Result<()> {
        let Some(st) = self.stat(rel)? else { return Ok(()) };
        if st.kind == Kind::Dir {
            for (n, _) in self.list(rel)? {
                self.remove(&rel.join(n))?;
            }
        }
        let (dir, name) = self.parent(rel)?;
        let flag = if st.kind == Kind::Dir { UnlinkatFlags::RemoveDir } else { UnlinkatFlags::NoRemoveDir };
        match unlinkat(dir.as_fd(), name, flag) {
            Ok(()) | Err(Errno::ENOENT) => Ok(()),
            Err(e) => Err(errno(e)),
        }
    }

    /// Writes `bytes` as the regular file `rel` with `mode`: a new file in the same directory,
    /// renamed over the name (whatever was there, a link included, is replaced, not written
    /// through). The directory must exist and be reached without a link.
    pub fn write(&self, rel: &Path, bytes: &[u8], mode: u32) -> io::Result<()> {
        self.put(rel, &mut &bytes[..], mode, None, true)
    }

    /// `write`, from a reader (copied as it is read, never held whole), with the modification
    /// time `mtime_ns` when given; not flushed to disk file by file (as `git checkout` does not:
    /// `apply` of 10,000 files took 10 s that way).
    pub fn write_from(
        &self,
        rel: &Path,
        from: &mut dyn Read,
        mode: u32,
        mtime_ns: Option<u64>,
    ) -> io::Result<()> {
        self.put(rel, from, mode, mtime_ns, false)
    }

    fn put(
        &self,
        rel: &Path,
        from: &mut dyn Read,
        mode: u32,
        mtime_ns: Option<u64>,
        sync: bool,
    ) -> io::Result<()> {
        let (dir, name) = self.parent(rel)?;
        let tmp = temp_name(name);
        let fd = openat(dir.as_fd(), tmp.as_os_str(), NEW_FLAGS, Mode::from_bits_truncate(0o600))
            .map_err(errno)?;
        let written = (|| {
            fchmod(fd.as_fd(), Mode::from_bits_truncate(mode & 0o7777)).map_err(errno)?;
            let mut f = std::fs::File::from(fd);
            io::copy(from, &mut f)?;
            if let Some(t) = mtime_ns {
                let ts = std::fs::FileTimes::new()
                    .set_modified(std::time::UNIX_EPOCH + std::time::Duration::from_nanos(t));
                f.set_times(ts)?;
            }
            if sync {
                f.sync_all()?;
            }
            renameat(dir.as_fd(), tmp.as_os_str(), dir.as_fd(), name).map_err(errno)
        })();
        if written.is_err() {
            let _ = unlinkat(dir.as_fd(), tmp.as_os_str(), UnlinkatFlags::NoRemoveDir);
        }
        written
    }

    /// Makes the directories of `rel` that are missing (`mode`), each reached without a link:
    /// a link or file on the way is an error.
    pub fn mkdir_all(&self, rel: &Path, mode: u32) -> io::Result<()> {
        let mut fd = self.root.try_clone()?;
        for n in names(rel)? {
            fd = match openat(fd.as_fd(), n, DIR_FLAGS, Mode::empty()) {
                Ok(next) => next,
                Err(Errno::ENOENT) => {
                    match mkdirat(fd.as_fd(), n, Mode::from_bits_truncate(mode)) {
                        Ok(()) | Err(Errno::EEXIST) => {}
                        Err(e) => return Err(errno(e)),
                    }
                    openat(fd.as_fd(), n, DIR_FLAGS, Mode::empty()).map_err(errno)?
                }
                Err(e) => return Err(errno(e)),
            };
        }
        Ok(())
    }

    /// Sets the permission bits of the file or directory at `rel` (a link or fifo is refused).
    /// The path is opened `O_PATH` (no read permission needed: a directory the sandbox made
    /// mode 000 is opened up this way) and changed through its `/proc/self/fd` entry, which is
    /// the inode itself, never a link's target.
    pub fn chmod(&self, rel: &Path, mode: u32) -> io::Result<()> {
        use std::os::fd::AsRawFd;
        use std::os::unix::fs::PermissionsExt;
        let (dir, name) = self.parent(rel)?;
        let fd = openat(dir.as_fd(), name, PATH_FLAGS, Mode::empty()).map_err(errno)?;
        let kind = Kind::of_mode(fstat(fd.as_fd()).map_err(errno)?.st_mode);
        if !matches!(kind, Kind::File | Kind::Dir) {
            return Err(not_a(kind, "a file or directory"));
        }
        let me = Path::new("/proc/self/fd").join(fd.as_raw_fd().to_string());
        std::fs::set_permissions(me, std::fs::Permissions::from_mode(mode & 0o7777))
    }

    /// Moves what is at `rel` to `to` in the tree `dest` (on the same filesystem: EXDEV
    /// otherwise, for the caller to copy instead), neither name followed. `replace`: whatever is
    /// at `to` is replaced (a link there is replaced, not written through); otherwise the move
    /// fails (EEXIST) if anything is there.
    pub fn move_to(&self, rel: &Path, dest: &Tree, to: &Path, replace: bool) -> io::Result<()> {
        let (a, an) = self.parent(rel)?;
        let (b, bn) = dest.parent(to)?;
        let flags = if replace {
            nix::fcntl::RenameFlags::empty()
        } else {
            nix::fcntl::RenameFlags::RENAME_NOREPLACE
        };
        nix::fcntl::renameat2(a.as_fd(), an, b.as_fd(), bn, flags).map_err(errno)
    }

    /// Makes `to` another name of the file at `from` (both in the tree, neither followed): a
    /// new name renamed over `to`, so whatever was there is replaced.
    pub fn hard_link(&self, from: &Path, to: &Path) -> io::Result<()> {
        let (a, an) = self.parent(from)?;
        let (b, bn) = self.parent(to)?;
        let tmp = temp_name(bn);
        nix::unistd::linkat(a.as_fd(), an, b.as_fd(), tmp.as_os_str(), AtFlags::empty()).map_err(errno)?;
        renameat(b.as_fd(), tmp.as_os_str(), b.as_fd(), bn).map_err(|e| {
            let _ = unlinkat(b.as_fd(), tmp.as_os_str(), UnlinkatFlags::NoRemoveDir);
            errno(e)
        })
    }

    /// Makes a symbolic link at `rel` to `target` (for putting a recorded link back).
    pub fn symlink(&self, target: &Path, rel: &Path) -> io::Result<()> {
        let (dir, name) = self.parent(rel)?;
        symlinkat(target, dir.as_fd(), name).map_err(errno)
    }
}

/// Sets the extended attribute `name` of `p` (not followed) to `value`: for tests that make by
/// hand what an overlay marks (an opaque directory) or what `Tree::xattr` reads.
#[cfg(test)]
pub(crate) fn set_xattr(p: &Path, name: &str, value: &[u8]) -> io::Result<()> {
    let c = std::ffi::CString::new(p.as_os_str().as_bytes())?;
    let n = std::ffi::CString::new(name)?;
    // SAFETY: both strings are NUL-terminated; the value's pointer and length are one slice's.
    let set = unsafe { libc::lsetxattr(c.as_ptr(), n.as_ptr(), value.as_ptr().cast(), value.len(), 0) };
    if set != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The entries of an open directory, with what each is (never followed), sorted by name.
pub fn entries(fd: &OwnedFd) -> io::Result<Vec<(OsString, Kind)>> {
    let mut dir = Dir::from_fd(fd.try_clone()?).map_err(errno)?;
    let mut out = Vec::new();
    for e in dir.iter() {
        let e = e.map_err(errno)?;
        let name = OsStr::from_bytes(e.file_name().to_bytes());
        if name == "." || name == ".." {
            continue;
        }
        let kind = match e.file_type() {
            Some(DirType::File) => Kind::File,
            Some(DirType::Directory) => Kind::Dir,
            Some(DirType::Symlink) => Kind::Link,
            Some(DirType::Fifo) => Kind::Fifo,
            Some(DirType::Socket) => Kind::Socket,
            Some(DirType::CharacterDevice) | Some(DirType::BlockDevice) => Kind::Device,
            None => match fstatat(fd.as_fd(), name, AtFlags::AT_SYMLINK_NOFOLLOW) {
                Ok(st) => Kind::of_mode(st.st_mode),
                Err(_) => continue,
            },
        };
        out.push((name.to_os_string(), kind));
    }
    out.sort();
    Ok(out)
}

/// The file at `rel` read to at most `max` bytes: a byte more (it grew past the bound while
/// read) is an error naming it. No more than that byte past the bound is ever read.
struct Capped<'a> {
    from: io::Take<std::fs::File>,
    read: u64,
    max: u64,
    rel: &'a Path,
}

impl<'a> Capped<'a> {
    fn new(f: std::fs::File, max: u64, rel: &'a Path) -> Capped<'a> {
        Capped { from: f.take(max.saturating_add(1)), read: 0, max, rel }
    }
}

impl Read for Capped<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.from.read(buf)?;
        self.read += n as u64;
        if self.read > self.max {
            return Err(too_large(self.rel, self.max));
        }
        Ok(n)
    }
}

/// A file `fstat` says is `len` bytes, past the `max` a copy takes.
fn too_large_to_copy(rel: &Path, len: u64, max: u64) -> io::Error {
    let what = format!("{} is {len} bytes, more than {max} (not copied)", crate::sys::quote::path(rel));
    io::Error::new(io::ErrorKind::InvalidData, what)
}

fn too_large(rel: &Path, cap: u64) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("{} is larger than {cap} bytes", crate::sys::quote::path(rel)),
    )
}

/// A name beside `name` for a file being written, renamed over `name` once complete.
fn temp_name(name: &OsStr) -> OsString {
    let mut tmp = OsString::from(".");
    tmp.push(name);
    tmp.push(format!(".aisb-{}-{:x}", std::process::id(), nanos()));
    tmp
}

fn nanos() -> u128 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos())
}

/// The birth time of `name` in `dir`, 0 where none is kept: `lstat` through the descriptor's
/// `/proc/self/fd` entry (the directory already reached), which std asks of statx.
fn born(dir: &OwnedFd, name: &OsStr) -> u64 {
    use std::os::fd::AsRawFd;
    let p = Path::new("/proc/self/fd").join(dir.as_raw_fd().to_string()).join(name);
    let t = std::fs::symlink_metadata(p).and_then(|m| m.created());
    t.ok().and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok()).map_or(0, |d| d.as_nanos() as u64)
}

#[cfg(test)]
mod tests;
