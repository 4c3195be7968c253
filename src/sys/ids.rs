//! Session ids as users type them: the whole id, or its start (ids are random hex, so a few
//! characters name one). `diff`, `apply`, `discard`, `exec --session` and `logs --session` read
//! a session id through `named`, so a shortened id works the same in each.

/// What a typed id names among `ids`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Named<'a> {
    One(&'a str),
    None,
    /// Several start that way (listed, for the user to pick from).
    Several(Vec<&'a str>),
}

/// The id `given` names: an id equal to it, else the only one that starts with it.
pub fn named<'a>(ids: impl IntoIterator<Item = &'a str>, given: &str) -> Named<'a> {
    let mut found: Vec<&str> =
        ids.into_iter().filter(|i| !given.is_empty() && i.starts_with(given)).collect();
    found.sort_unstable();
    found.dedup();
    if let Some(exact) = found.iter().find(|i| **i == given) {
        return Named::One(exact);
    }
    match found.as_slice() {
        [] => Named::None,
        [one] => Named::One(one),
        _ => Named::Several(found),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_whole_id_or_a_start_that_only_one_has_names_it() {
        let ids = ["0b62a1f3c9d4", "0b7700112233", "ffee00aa11bb"];
        assert_eq!(named(ids, "0b62"), Named::One("0b62a1f3c9d4"));
        assert_eq!(named(ids, "0b62a1f3c9d4"), Named::One("0b62a1f3c9d4"));
        assert_eq!(named(ids, "0b"), Named::Several(vec!["0b62a1f3c9d4", "0b7700112233"]));
        assert_eq!(named(ids, "x"), Named::None);
        assert_eq!(named(ids, ""), Named::None, "nothing typed names nothing");
        // A whole id that also starts another is that one; the same id twice is one.
        assert_eq!(named(["ab", "abc"], "ab"), Named::One("ab"));
        assert_eq!(named(["abc", "abc"], "a"), Named::One("abc"));
    }
}
