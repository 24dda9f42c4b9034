//! Sets of CPU and NUMA node numbers, and the kernel's list format for them (`0-3,8-11`).
//!
//! cgroup `cpuset.cpus`/`cpuset.mems` and NRI's `LinuxCPU.cpus`/`mems` all speak this format, so
//! it is how these sets print, parse and serialize. hwloc has no parser for it (see the hwloc
//! notes), hence our own.

use std::{fmt, str::FromStr};

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The largest CPU or node number we accept when parsing: far above any real machine, low enough
/// that a hostile string cannot make us allocate gigabytes.
pub const MAX_ID: u32 = 65_535;

/// A set of CPU or NUMA node numbers (kernel numbering).
#[derive(Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct IdSet {
    /// Bit `i % 64` of word `i / 64` is set when `i` is in the set. No trailing zero words, so
    /// equal sets compare equal.
    words: Vec<u64>,
}

/// A set of CPUs.
pub type CpuSet = IdSet;
/// A set of NUMA nodes.
pub type NodeSet = IdSet;

/// Why a list-format string did not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid cpu/node list {input:?}: {reason}")]
pub struct IdSetParseError {
    /// The whole input.
    pub input: String,
    /// What was wrong with it.
    pub reason: String,
}

impl IdSet {
    /// The empty set.
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether `id` is in the set.
    pub fn contains(&self, id: u32) -> bool {
        let (w, b) = split(id);
        self.words.get(w).is_some_and(|word| word & (1 << b) != 0)
    }

    /// Adds `id`; returns whether it was new.
    pub fn insert(&mut self, id: u32) -> bool {
        let (w, b) = split(id);
        if self.words.len() <= w {
            self.words.resize(w + 1, 0);
        }
        let new = self.words[w] & (1 << b) == 0;
        self.words[w] |= 1 << b;
        new
    }

    /// Removes `id`; returns whether it was present.
    pub fn remove(&mut self, id: u32) -> bool {
        let (w, b) = split(id);
        let Some(word) = self.words.get_mut(w) else {
            return false;
        };
        let present = *word & (1 << b) != 0;
        *word &= !(1 << b);
        self.trim();
        present
    }

    /// Number of members.
    pub fn len(&self) -> usize {
        self.words.iter().map(|w| w.count_ones() as usize).sum()
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.words.is_empty()
    }

    /// Members in ascending order.
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = u32> + '_ {
        self.words.iter().enumerate().flat_map(|(w, &word)| {
            (0..64u32)
                .filter(move |b| word & (1 << b) != 0)
                .map(move |b| {
                    // w < words.len() <= MAX_ID / 64 + 1, so this cannot overflow.
                    u32::try_from(w).unwrap_or(u32::MAX / 64) * 64 + b
                })
        })
    }

    /// The smallest member.
    pub fn first(&self) -> Option<u32> {
        self.iter().next()
    }

    /// Members in both sets.
    pub fn intersection(&self, other: &Self) -> Self {
        let mut out = Self {
            words: self
                .words
                .iter()
                .zip(&other.words)
                .map(|(a, b)| a & b)
                .collect(),
        };
        out.trim();
        out
    }

    /// Members in either set.
    pub fn union(&self, other: &Self) -> Self {
        let (long, short) = if self.words.len() >= other.words.len() {
            (self, other)
        } else {
            (other, self)
        };
        let mut words = long.words.clone();
        for (w, s) in words.iter_mut().zip(&short.words) {
            *w |= s;
        }
        Self { words }
    }

    /// Members of `self` not in `other`.
    pub fn difference(&self, other: &Self) -> Self {
        let mut words = self.words.clone();
        for (w, o) in words.iter_mut().zip(&other.words) {
            *w &= !o;
        }
        let mut out = Self { words };
        out.trim();
        out
    }

    /// Whether every member of `other` is in `self`.
    pub fn is_superset(&self, other: &Self) -> bool {
        other.difference(self).is_empty()
    }

    /// Whether the sets share a member.
    pub fn intersects(&self, other: &Self) -> bool {
        self.words.iter().zip(&other.words).any(|(a, b)| a & b != 0)
    }

    fn trim(&mut self) {
        while self.words.last() == Some(&0) {
            self.words.pop();
        }
    }
}

fn split(id: u32) -> (usize, u32) {
    ((id / 64) as usize, id % 64)
}

impl FromIterator<u32> for IdSet {
    fn from_iter<I: IntoIterator<Item = u32>>(iter: I) -> Self {
        let mut set = Self::new();
        for id in iter {
            set.insert(id);
        }
        set
    }
}

impl Extend<u32> for IdSet {
    fn extend<I: IntoIterator<Item = u32>>(&mut self, iter: I) {
        for id in iter {
            self.insert(id);
        }
    }
}

/// The kernel's list format, as `cpuset.cpus` prints it: ascending, every run of consecutive
/// members as `a-b` (two included: `0-1`), single members bare, the empty set as "".
impl fmt::Display for IdSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut ids = self.iter().peekable();
        let mut first = true;
        while let Some(start) = ids.next() {
            let mut end = start;
            while ids.peek() == Some(&(end + 1)) {
                end += 1;
                ids.next();
            }
            if !first {
                f.write_str(",")?;
            }
            first = false;
            if start == end {
                write!(f, "{start}")?;
            } else {
                write!(f, "{start}-{end}")?;
            }
        }
        Ok(())
    }
}

impl fmt::Debug for IdSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "IdSet({self})")
    }
}

impl FromStr for IdSet {
    type Err = IdSetParseError;

    /// Parses the list format: comma-separated members and inclusive ranges, surrounding
    /// whitespace and a trailing newline tolerated (sysfs files end in one), "" is the empty set.
    fn from_str(input: &str) -> Result<Self, Self::Err> {
        let err = |reason: String| IdSetParseError {
            input: input.to_owned(),
            reason,
        };
        let mut set = Self::new();
        let trimmed = input.trim();
        if trimmed.is_empty() {
            return Ok(set);
        }
        for part in trimmed.split(',') {
            let part = part.trim();
            let id = |s: &str| -> Result<u32, IdSetParseError> {
                let n: u32 = s
                    .parse()
                    .map_err(|_| err(format!("{s:?} is not a number")))?;
                if n > MAX_ID {
                    return Err(err(format!("{n} is above the limit of {MAX_ID}")));
                }
                Ok(n)
            };
            match part.split_once('-') {
                Some((a, b)) => {
                    let (a, b) = (id(a)?, id(b)?);
                    if a > b {
                        return Err(err(format!("range {a}-{b} runs backwards")));
                    }
                    set.extend(a..=b);
                }
                None if part.is_empty() => return Err(err("empty element".into())),
                None => {
                    set.insert(id(part)?);
                }
            }
        }
        Ok(set)
    }
}

impl Serialize for IdSet {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for IdSet {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn set(ids: &[u32]) -> IdSet {
        ids.iter().copied().collect()
    }

    #[test]
    fn formats_like_the_kernel() {
        assert_eq!(set(&[]).to_string(), "");
        assert_eq!(set(&[3]).to_string(), "3");
        assert_eq!(set(&[0, 1]).to_string(), "0-1");
        assert_eq!(
            set(&[0, 1, 2, 3, 8, 9, 10, 11, 64, 200]).to_string(),
            "0-3,8-11,64,200"
        );
    }

    #[test]
    fn parses_the_list_format() {
        assert_eq!(
            "0-3,8-11\n".parse::<IdSet>().unwrap(),
            set(&[0, 1, 2, 3, 8, 9, 10, 11])
        );
        assert_eq!(" 5 , 7-7 ".parse::<IdSet>().unwrap(), set(&[5, 7]));
        assert_eq!("".parse::<IdSet>().unwrap(), set(&[]));
    }

    #[test]
    fn refuses_malformed_lists_naming_the_problem() {
        for (input, reason) in [
            ("3-1", "runs backwards"),
            ("1,,2", "empty element"),
            ("a", "not a number"),
            ("-1", "not a number"),
            ("70000", "above the limit"),
            ("0-4294967295", "above the limit"),
            ("0-4294967296", "not a number"),
        ] {
            let err = input.parse::<IdSet>().unwrap_err();
            assert!(err.reason.contains(reason), "{input:?}: {err}");
            assert_eq!(err.input, input);
        }
    }

    #[test]
    fn set_algebra() {
        let a = set(&[0, 1, 2, 70]);
        let b = set(&[2, 3, 70]);
        assert_eq!(a.intersection(&b), set(&[2, 70]));
        assert_eq!(a.union(&b), set(&[0, 1, 2, 3, 70]));
        assert_eq!(a.difference(&b), set(&[0, 1]));
        assert!(a.intersects(&b));
        assert!(!set(&[0]).intersects(&set(&[64])));
        assert!(a.is_superset(&set(&[1, 70])));
        assert!(!a.is_superset(&b));
        // Difference down to nothing is the canonical empty set.
        assert_eq!(set(&[100]).difference(&set(&[100])), IdSet::new());
        assert_eq!(set(&[1, 100]).len(), 2);
    }

    proptest! {
        #[test]
        fn format_and_parse_round_trip(ids in proptest::collection::btree_set(0u32..2048, 0..200)) {
            let s: IdSet = ids.iter().copied().collect();
            let text = s.to_string();
            prop_assert_eq!(text.parse::<IdSet>().unwrap(), s.clone());
            prop_assert_eq!(s.iter().collect::<Vec<_>>(), ids.into_iter().collect::<Vec<_>>());
            let json = serde_json::to_string(&s).unwrap();
            prop_assert_eq!(serde_json::from_str::<IdSet>(&json).unwrap(), s);
        }
    }
}
