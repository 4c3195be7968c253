//! Each refusal beside the same operation on a plain file or directory that works.

use super::*;
use std::fs;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::time::{Duration, Instant};

fn setup() -> (tempfile::TempDir, PathBuf, PathBuf) {
    let t = tempfile::tempdir().unwrap();
    let tree = t.path().join("project");
    let outside = t.path().join("outside");
    fs::create_dir_all(tree.join("repo/.git")).unwrap();
    fs::create_dir_all(&outside).unwrap();
    fs::write(outside.join("secret"), "token").unwrap();
    fs::write(tree.join("repo/.git/config"), "[core]\n").unwrap();
    (t, tree, outside)
}

fn mkfifo(p: &Path) {
    nix::unistd::mkfifo(p, Mode::from_bits_truncate(0o600)).unwrap();
}

#[test]
fn a_tree_is_a_directory() {
    let (_t, p, _) = setup();
    assert!(Tree::open(&p.join("repo/.git/config")).is_err(), "a file is no tree");
    assert!(Tree::open(&p.join("repo")).is_ok());
}

#[test]
fn a_regular_file_is_read_and_a_link_to_one_is_not() {
    let (_t, p, outside) = setup();
    let tree = Tree::open(&p).unwrap();
    assert_eq!(tree.read(Path::new("repo/.git/config"), 100).unwrap(), b"[core]\n");
    symlink(outside.join("secret"), p.join("repo/.git/linked")).unwrap();
    let e = tree.read(Path::new("repo/.git/linked"), 100).unwrap_err();
    assert!(e.to_string().contains("a symbolic link"), "{e}");
}

#[test]
fn a_link_above_the_path_is_not_followed() {
    let (_t, p, outside) = setup();
    symlink(&outside, p.join("repo/up")).unwrap();
    let tree = Tree::open(&p).unwrap();
    assert!(tree.read(Path::new("repo/up/secret"), 100).is_err());
    assert_eq!(tree.stat(Path::new("repo/up/secret")).unwrap(), None);
    assert!(tree.list(Path::new("repo/up")).unwrap_err().to_string().contains("symbolic link"));
    // control: the same file reached as a real directory is read
    let outer = Tree::open(outside.parent().unwrap()).unwrap();
    assert_eq!(outer.read(Path::new("outside/secret"), 100).unwrap(), b"token");
}

#[test]
fn dot_dot_and_absolute_paths_are_refused() {
    let (_t, p, _) = setup();
    let tree = Tree::open(&p).unwrap();
    for rel in ["../outside/secret", "/etc/passwd", "repo/../../outside/secret"] {
        let e = tree.read(Path::new(rel), 100).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{rel}");
        // an error, not "nothing there": the caller must not take it for a missing file
        assert_eq!(tree.stat(Path::new(rel)).unwrap_err().kind(), io::ErrorKind::InvalidInput, "{rel}");
    }
    assert!(tree.read(Path::new("./repo/.git/config"), 100).is_ok());
}

#[test]
fn a_fifo_is_refused_at_once_and_never_blocks() {
    let (_t, p, _) = setup();
    mkfifo(&p.join("repo/.git/config.worktree"));
    let tree = Tree::open(&p).unwrap();
    let start = Instant::now();
    let e = tree.read(Path::new("repo/.git/config.worktree"), 100).unwrap_err();
    assert!(e.to_string().contains("a fifo"), "{e}");
    assert!(start.elapsed() < Duration::from_secs(5));
    assert_eq!(tree.stat(Path::new("repo/.git/config.worktree")).unwrap().unwrap().kind, Kind::Fifo);
    let l = tree.list(Path::new("repo/.git")).unwrap();
    assert_eq!(l, vec![("config".into(), Kind::File), ("config.worktree".into(), Kind::Fifo)]);
}

#[test]
fn a_socket_is_refused() {
    let (_t, p, _) = setup();
    let _l = std::os::unix::net::UnixListener::bind(p.join("repo/sock")).unwrap();
    let tree = Tree::open(&p).unwrap();
    assert!(tree.read(Path::new("repo/sock"), 100).unwrap_err().to_string().contains("a socket"));
    assert_eq!(tree.stat(Path::new("repo/sock")).unwrap().unwrap().kind, Kind::Socket);
}

#[test]
fn a_file_past_the_cap_is_refused() {
    let (_t, p, _) = setup();
    fs::write(p.join("big"), vec![b'x'; 101]).unwrap();
    fs::write(p.join("fits"), vec![b'x'; 100]).unwrap();
    let tree = Tree::open(&p).unwrap();
    assert!(tree.read(Path::new("big"), 100).unwrap_err().to_string().contains("larger than 100"));
    assert_eq!(tree.read(Path::new("fits"), 100).unwrap().len(), 100);
}

#[test]
fn a_write_replaces_a_link_and_leaves_its_target_alone() {
    let (_t, p, outside) = setup();
    fs::remove_file(p.join("repo/.git/config")).unwrap();
    symlink(outside.join("secret"), p.join("repo/.git/config")).unwrap();
    let tree = Tree::open(&p).unwrap();
    tree.write(Path::new("repo/.git/config"), b"clean\n", 0o640).unwrap();
    assert_eq!(fs::read(outside.join("secret")).unwrap(), b"token");
    let m = fs::symlink_metadata(p.join("repo/.git/config")).unwrap();
    assert!(m.is_file());
    assert_eq!(m.permissions().mode() & 0o777, 0o640);
    assert_eq!(fs::read(p.join("repo/.git/config")).unwrap(), b"clean\n");
    // no temporary file is left beside it
    assert_eq!(tree.list(Path::new("repo/.git")).unwrap().len(), 1);
}

#[test]
fn a_write_through_a_linked_directory_is_refused() {
    let (_t, p, outside) = setup();
    symlink(&outside, p.join("store")).unwrap();
    let tree = Tree::open(&p).unwrap();
    assert!(tree.write(Path::new("store/secret"), b"x", 0o600).is_err());
    assert_eq!(fs::read(outside.join("secret")).unwrap(), b"token");
    assert!(tree.mkdir_all(Path::new("store/deeper"), 0o700).is_err());
    assert!(!outside.join("deeper").exists());
    // control: a real directory is made and written
    tree.mkdir_all(Path::new("real/deeper"), 0o700).unwrap();
    tree.write(Path::new("real/deeper/f"), b"x", 0o600).unwrap();
    assert_eq!(fs::read(p.join("real/deeper/f")).unwrap(), b"x");
}

#[test]
fn moving_a_linked_directory_moves_the_link_not_what_it_holds() {
    let (t, p, outside) = setup();
    fs::remove_dir_all(p.join("repo/.git")).unwrap();
    fs::create_dir(p.join("repo/.git")).unwrap();
    symlink(&outside, p.join("repo/.git/hooks")).unwrap();
    let tree = Tree::open(&p).unwrap();
    let dest = tree.move_out(Path::new("repo/.git/hooks"), &t.path().join("quarantine")).unwrap();
    assert_eq!(dest, t.path().join("quarantine/repo/.git/hooks"));
    assert!(fs::symlink_metadata(&dest).unwrap().file_type().is_symlink());
    assert_eq!(fs::read(outside.join("secret")).unwrap(), b"token");
    assert!(fs::symlink_metadata(p.join("repo/.git/hooks")).is_err());
}

/// A link the sandbox made, once in the quarantine, is not a way out for what is moved there
/// after it (the guard moved `.git`, a link out, then a file that was below the `.git` put back
/// in its place): the second goes beside it, and the place the link leads is untouched.
#[test]
fn the_quarantine_is_never_a_way_through_what_was_moved_into_it() {
    let (t, p, outside) = setup();
    let q = t.path().join("quarantine");
    let tree = Tree::open(&p).unwrap();
    fs::remove_dir_all(p.join("repo/.git")).unwrap();
    symlink(&outside, p.join("repo/.git")).unwrap();
    let first = tree.move_out(Path::new("repo/.git"), &q).unwrap();
    assert_eq!(fs::read_link(&first).unwrap(), outside);
    fs::create_dir(p.join("repo/.git")).unwrap();
    fs::write(p.join("repo/.git/config"), "sandbox's").unwrap();
    let second = tree.move_out(Path::new("repo/.git/config"), &q).unwrap();
    assert_eq!(second, q.join(".aside-1/repo/.git/config"));
    assert_eq!(fs::read(&second).unwrap(), b"sandbox's");
    assert!(!outside.join("config").exists(), "written through the quarantined link");
    // The same place taken again: nothing in the quarantine is replaced.
    fs::write(p.join("repo/.git/config"), "again").unwrap();
    let third = tree.move_out(Path::new("repo/.git/config"), &q).unwrap();
    assert_eq!(third, q.join(".aside-2/repo/.git/config"));
    assert_eq!(fs::read(&second).unwrap(), b"sandbox's");
    // Control: a free place is the same relative path.
    fs::write(p.join("plain"), "x").unwrap();
    assert_eq!(tree.move_out(Path::new("plain"), &q).unwrap(), q.join("plain"));
}

/// A quarantine has room for a thousand copies of one path beside the first; past that, the move
/// is refused with the place, and nothing is moved.
#[test]
fn the_quarantine_takes_a_thousand_asides_of_one_path_and_says_when_it_is_full() {
    let (t, p, _) = setup();
    let q = t.path().join("quarantine");
    fs::create_dir_all(&q).unwrap();
    fs::write(q.join("f"), "first").unwrap();
    for n in 1..1000 {
        fs::create_dir(q.join(format!(".aside-{n}"))).unwrap();
        fs::write(q.join(format!(".aside-{n}/f")), "earlier").unwrap();
    }
    let tree = Tree::open(&p).unwrap();
    fs::write(p.join("f"), "last fits").unwrap();
    assert_eq!(tree.move_out(Path::new("f"), &q).unwrap(), q.join(".aside-1000/f"));
    assert_eq!(fs::read(q.join(".aside-1000/f")).unwrap(), b"last fits");
    fs::write(p.join("f"), "no room").unwrap();
    let e = tree.move_out(Path::new("f"), &q).unwrap_err();
    assert!(e.to_string().contains("no free place in"), "{e}");
    assert_eq!(fs::read(p.join("f")).unwrap(), b"no room", "left where it was");
}

#[test]
fn copy_out_and_remove_never_follow_links() {
    let (t, p, outside) = setup();
    fs::create_dir_all(p.join("d/e")).unwrap();
    fs::write(p.join("d/e/f"), "f").unwrap();
    symlink(&outside, p.join("d/link")).unwrap();
    mkfifo(&p.join("d/fifo"));
    let tree = Tree::open(&p).unwrap();
    let dest = t.path().join("copy");
    fs::create_dir(&dest).unwrap();
    tree.copy_out(Path::new("d"), &Tree::open(&dest).unwrap(), Path::new("d"), MOVE_COPY_MAX).unwrap();
    let dest = dest.join("d");
    assert_eq!(fs::read(dest.join("e/f")).unwrap(), b"f");
    assert_eq!(fs::read_link(dest.join("link")).unwrap(), outside);
    tree.remove(Path::new("d")).unwrap();
    assert!(!p.join("d").exists());
    assert_eq!(fs::read(outside.join("secret")).unwrap(), b"token");
}

/// A file longer than the bound, as `fstat` says, is refused before it is read (nothing is left
/// where it would have gone); one at the bound is copied byte for byte, with its mode (the
/// control).
#[test]
fn copy_out_refuses_a_file_over_the_bound_and_copies_one_at_it() {
    let (t, p, _) = setup();
    let at: Vec<u8> = (0..100).collect();
    fs::write(p.join("at"), &at).unwrap();
    fs::set_permissions(p.join("at"), fs::Permissions::from_mode(0o751)).unwrap();
    fs::write(p.join("over"), vec![b'x'; 101]).unwrap();
    let tree = Tree::open(&p).unwrap();
    fs::create_dir(t.path().join("copy")).unwrap();
    let dest = Tree::open(&t.path().join("copy")).unwrap();
    tree.copy_out(Path::new("at"), &dest, Path::new("at"), 100).unwrap();
    assert_eq!(fs::read(t.path().join("copy/at")).unwrap(), at);
    assert_eq!(fs::metadata(t.path().join("copy/at")).unwrap().permissions().mode() & 0o777, 0o751);
    let e = tree.copy_out(Path::new("over"), &dest, Path::new("over"), 100).unwrap_err();
    assert_eq!(e.to_string(), "over is 101 bytes, more than 100 (not copied)");
    assert_eq!(dest.list(Path::new("")).unwrap(), [("at".into(), Kind::File)], "nothing else there");
}

/// A file that reads longer than `fstat` says (as one still growing does; /proc's say 0) is
/// stopped at the bound while copied, and its partial copy removed; under the bound it is
/// copied (the control). `read` is bound the same way.
#[test]
fn copy_out_stops_a_file_that_grows_past_the_bound_while_read() {
    let proc_self = Tree::open(Path::new("/proc/self")).unwrap();
    let status = Path::new("status");
    assert_eq!(proc_self.stat(status).unwrap().map(|st| (st.kind, st.len)), Some((Kind::File, 0)));
    let t = tempfile::tempdir().unwrap();
    let dest = Tree::open(t.path()).unwrap();
    let e = proc_self.copy_out(status, &dest, Path::new("cut"), 16).unwrap_err();
    assert_eq!(e.to_string(), "status is larger than 16 bytes");
    assert!(dest.list(Path::new("")).unwrap().is_empty(), "no partial copy, no temporary file");
    assert_eq!(proc_self.read(status, 16).unwrap_err().to_string(), "status is larger than 16 bytes");
    proc_self.copy_out(status, &dest, Path::new("whole"), 1 << 20).unwrap();
    assert!(fs::read_to_string(t.path().join("whole")).unwrap().starts_with("Name:"));
}

#[test]
fn chmod_refuses_a_link_and_changes_a_directory() {
    let (_t, p, outside) = setup();
    symlink(&outside, p.join("l")).unwrap();
    let tree = Tree::open(&p).unwrap();
    assert!(tree.chmod(Path::new("l"), 0o777).is_err());
    assert_ne!(fs::metadata(&outside).unwrap().permissions().mode() & 0o777, 0o777);
    tree.chmod(Path::new("repo"), 0o700).unwrap();
    assert_eq!(fs::metadata(p.join("repo")).unwrap().permissions().mode() & 0o777, 0o700);
    let st = tree.stat(Path::new("repo")).unwrap().unwrap();
    assert_eq!((st.kind, st.mode), (Kind::Dir, 0o700), "the permission bits alone");
    // a directory closed to everyone (mode 000) is opened up without reading it first
    tree.chmod(Path::new("repo"), 0).unwrap();
    tree.chmod(Path::new("repo"), 0o700).unwrap();
    assert!(tree.list(Path::new("repo")).is_ok());
    // a fifo is refused
    mkfifo(&p.join("f"));
    assert!(tree.chmod(Path::new("f"), 0o777).is_err());
}

#[test]
fn a_directory_that_cannot_be_opened_keeps_its_error() {
    let (_t, p, _) = setup();
    let tree = Tree::open(&p).unwrap();
    // Opened from a parent that has no such entry: the error is the open's (not found), not a
    // claim that something else stands there; the same path from the root opens.
    let other = tree.open_dir(None, Path::new("repo/.git")).unwrap();
    let e = tree.open_dir(Some(&other), Path::new("repo")).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::NotFound, "{e}");
    assert!(tree.open_dir(None, Path::new("repo")).is_ok());
    // A file where a directory is expected is said as such.
    let e = tree.open_dir(None, Path::new("repo/.git/config")).unwrap_err();
    assert!(e.to_string().contains("a file where a directory was expected"), "{e}");
}

#[test]
fn a_write_is_not_stopped_by_a_temporary_file_an_earlier_write_left() {
    let (_t, p, _) = setup();
    // What a write killed mid-way leaves, under the names a fixed suffix would take.
    for n in ["0", "1"] {
        fs::write(p.join(format!("repo/.f.aisb-{}-{n}", std::process::id())), "stale").unwrap();
    }
    let tree = Tree::open(&p).unwrap();
    tree.write(Path::new("repo/f"), b"new", 0o644).unwrap();
    assert_eq!(fs::read(p.join("repo/f")).unwrap(), b"new");
}

#[test]
fn a_paths_birth_time_is_the_one_the_filesystem_keeps() {
    let (_t, p, _) = setup();
    let tree = Tree::open(&p).unwrap();
    let kept = fs::symlink_metadata(p.join("repo")).unwrap().created().ok();
    let want = kept.map_or(0, |t| t.duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64);
    assert_eq!(tree.born(Path::new("repo")), want);
    assert_eq!(tree.born(Path::new("nothing")), 0);
}

#[test]
fn stat_says_times_links_and_device_numbers() {
    let (_t, p, _) = setup();
    let tree = Tree::open(&p).unwrap();
    let before = nanos() as u64;
    fs::write(p.join("f"), "x").unwrap();
    fs::hard_link(p.join("f"), p.join("g")).unwrap();
    let st = tree.stat(Path::new("f")).unwrap().unwrap();
    assert!(st.ctime_ns >= before - 20_000_000 && st.ctime_ns <= nanos() as u64, "{st:?} vs {before}");
    assert!(st.mtime_ns >= before - 20_000_000 && st.mtime_ns <= nanos() as u64, "{st:?}");
    assert_eq!(st.nlink, 2);
    assert_eq!(st.rdev, 0);
    let null = Tree::open(Path::new("/dev")).unwrap().stat(Path::new("null")).unwrap().unwrap();
    assert_eq!((null.kind, null.rdev), (Kind::Device, libc::makedev(1, 3)));
    assert_eq!(ns(2, 5), 2_000_000_005);
    assert_eq!(ns(-1, -1), 0);
}

#[test]
fn open_file_gives_a_regular_file_and_its_stat_and_refuses_the_rest() {
    let (_t, p, outside) = setup();
    let tree = Tree::open(&p).unwrap();
    let (mut f, st) = tree.open_file(Path::new("repo/.git/config")).unwrap();
    let mut s = String::new();
    f.read_to_string(&mut s).unwrap();
    assert_eq!((s.as_str(), st.len, st.kind), ("[core]\n", 7, Kind::File));
    symlink(outside.join("secret"), p.join("l")).unwrap();
    assert!(tree.open_file(Path::new("l")).unwrap_err().to_string().contains("symbolic link"));
    assert!(tree.open_file(Path::new("repo")).unwrap_err().to_string().contains("a directory where"));
}

#[test]
fn xattr_reads_a_set_attribute_and_says_none_for_an_unset_one() {
    let (_t, p, _) = setup();
    let tree = Tree::open(&p).unwrap();
    fs::write(p.join("x"), "").unwrap();
    if set_xattr(&p.join("x"), "user.aisb", b"y").is_err() {
        // A filesystem without user xattrs (tmpfs on old kernels): none is the answer there.
        assert_eq!(tree.xattr(Path::new("x"), "user.aisb").unwrap(), None);
        return;
    }
    assert_eq!(tree.xattr(Path::new("x"), "user.aisb").unwrap(), Some(b"y".to_vec()));
    // An empty value is set (the overlay's origin mark is one): Some, not None.
    set_xattr(&p.join("x"), "user.empty", b"").unwrap();
    assert_eq!(tree.xattr(Path::new("x"), "user.empty").unwrap(), Some(Vec::new()));
    assert_eq!(tree.xattr(Path::new("x"), "user.other").unwrap(), None);
    assert!(tree.xattr(Path::new("missing"), "user.aisb").is_err());
}

#[test]
fn write_from_copies_a_reader_with_its_mode_and_time_and_replaces_a_link() {
    let (_t, p, outside) = setup();
    let tree = Tree::open(&p).unwrap();
    symlink(outside.join("secret"), p.join("w")).unwrap();
    let t = 1_600_000_000_123_456_789u64;
    tree.write_from(Path::new("w"), &mut &b"data"[..], 0o750, Some(t)).unwrap();
    assert_eq!(fs::read(outside.join("secret")).unwrap(), b"token", "not written through the link");
    let st = tree.stat(Path::new("w")).unwrap().unwrap();
    assert_eq!((st.kind, st.mode, st.mtime_ns, st.len), (Kind::File, 0o750, t, 4));
    tree.write_from(Path::new("v"), &mut &b""[..], 0o600, None).unwrap();
    assert!(tree.stat(Path::new("v")).unwrap().unwrap().mtime_ns > t);
    assert_eq!(fs::read_dir(&p).unwrap().count(), 3, "no temporary file left: repo, w and v only");
}

#[test]
fn hard_link_makes_another_name_replacing_what_was_there() {
    let (_t, p, _) = setup();
    let tree = Tree::open(&p).unwrap();
    fs::write(p.join("a"), "A").unwrap();
    fs::write(p.join("b"), "B").unwrap();
    tree.hard_link(Path::new("a"), Path::new("b")).unwrap();
    let (a, b) = (tree.stat(Path::new("a")).unwrap().unwrap(), tree.stat(Path::new("b")).unwrap().unwrap());
    assert_eq!((a.ino, a.nlink), (b.ino, 2));
    assert_eq!(fs::read(p.join("b")).unwrap(), b"A");
    assert!(tree.hard_link(Path::new("missing"), Path::new("c")).is_err());
    assert!(!p.join("c").exists());
}

#[test]
fn move_to_moves_between_trees_and_replaces_only_when_told() {
    let (t, p, outside) = setup();
    let other = t.path().join("other");
    fs::create_dir_all(&other).unwrap();
    let (src, dst) = (Tree::open(&p).unwrap(), Tree::open(&other).unwrap());
    fs::write(p.join("a"), "A").unwrap();
    fs::write(p.join("b"), "B").unwrap();
    fs::write(other.join("b"), "old").unwrap();
    src.move_to(Path::new("a"), &dst, Path::new("a"), false).unwrap();
    assert_eq!(fs::read(other.join("a")).unwrap(), b"A");
    assert!(!p.join("a").exists(), "moved, not copied");
    let e = src.move_to(Path::new("b"), &dst, Path::new("b"), false).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EEXIST));
    assert_eq!(fs::read(other.join("b")).unwrap(), b"old", "nothing replaced without asking");
    symlink(outside.join("secret"), other.join("l")).unwrap();
    fs::write(p.join("l"), "L").unwrap();
    src.move_to(Path::new("l"), &dst, Path::new("l"), true).unwrap();
    assert_eq!(fs::read(outside.join("secret")).unwrap(), b"token", "the link was replaced, not followed");
    assert_eq!(fs::read(other.join("l")).unwrap(), b"L");
    assert!(src.move_to(Path::new("missing"), &dst, Path::new("m"), true).is_err());
}

/// The directory a walk reached last serves the next name in it, and is never one the tree
/// removed or moved: what comes after a removal or a move lands where the name now is.
#[test]
fn a_directory_removed_or_moved_is_not_written_through_its_old_walk() {
    let (t, p, _) = setup();
    let tree = Tree::open(&p).unwrap();
    let other = Tree::open(t.path().join("outside").as_path()).unwrap();
    let again = |what: &str| {
        tree.mkdir_all(Path::new("a/b"), 0o755).unwrap();
        tree.write(Path::new("a/b/f"), what.as_bytes(), 0o644).unwrap();
        assert_eq!(fs::read_to_string(p.join("a/b/f")).unwrap(), what, "after {what}");
        assert!(tree.stat(Path::new("a/b/f")).unwrap().is_some(), "after {what}");
    };
    again("first");
    tree.remove(Path::new("a")).unwrap();
    again("removed");
    tree.rename(Path::new("a"), Path::new("z")).unwrap();
    again("renamed");
    assert_eq!(fs::read_to_string(p.join("z/b/f")).unwrap(), "removed", "the renamed one kept its file");
    tree.move_to(Path::new("a"), &other, Path::new("m"), false).unwrap();
    again("moved away");
    tree.move_out(Path::new("a"), &t.path().join("quarantine")).unwrap();
    again("moved out");
    // Moved over: the tree that receives drops its walk into what was replaced.
    fs::create_dir_all(t.path().join("outside/src")).unwrap();
    fs::remove_file(p.join("a/b/f")).unwrap();
    assert!(tree.stat(Path::new("a/b/f")).unwrap().is_none());
    other.move_to(Path::new("src"), &tree, Path::new("a/b"), true).unwrap();
    tree.write(Path::new("a/b/g"), b"over", 0o644).unwrap();
    assert_eq!(fs::read_to_string(p.join("a/b/g")).unwrap(), "over");
}
