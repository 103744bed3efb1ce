//! Ranges of the numeric options. clap checks them while parsing, so a value out of range
//! stops the command before it does anything, with a message naming the option and the
//! allowed range, and exit status 2 (a usage error, as for an unknown option).

use clap::builder::RangedU64ValueParser;

/// A count of at least `min`.
pub(crate) fn count(min: u64) -> RangedU64ValueParser<usize> {
    RangedU64ValueParser::new().range(min..)
}

/// A count of at least `min`, as `u64`.
pub(crate) fn count_u64(min: u64) -> RangedU64ValueParser<u64> {
    RangedU64ValueParser::new().range(min..)
}

/// A count from `min` to `max`, as `u64`.
pub(crate) fn count_u64_between(min: u64, max: u64) -> RangedU64ValueParser<u64> {
    RangedU64ValueParser::new().range(min..=max)
}

/// A trie level: a key path has 64 nibbles.
pub(crate) fn trie_level() -> RangedU64ValueParser<usize> {
    RangedU64ValueParser::new().range(0..=64)
}

/// The shard counts the bottom layer supports.
pub(crate) fn shards(text: &str) -> Result<usize, String> {
    match text.parse::<usize>() {
        Ok(shards @ (1 | 16 | 256)) => Ok(shards),
        _ => Err("the bottom layer is split into 1, 16 or 256 shards".to_owned()),
    }
}

/// A finite number above zero (seconds, rates).
pub(crate) fn positive(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(value) if value.is_finite() && value > 0.0 => Ok(value),
        _ => Err("must be a number above 0".to_owned()),
    }
}

/// A finite number of at least zero (Zipf exponents).
pub(crate) fn non_negative(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(value) if value.is_finite() && value >= 0.0 => Ok(value),
        _ => Err("must be a number of at least 0".to_owned()),
    }
}

/// A probability.
pub(crate) fn probability(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(value) if (0.0..=1.0).contains(&value) => Ok(value),
        _ => Err("must be a number from 0 to 1".to_owned()),
    }
}

/// A count from `min` to `max`.
pub(crate) fn count_between(min: u64, max: u64) -> RangedU64ValueParser<usize> {
    RangedU64ValueParser::new().range(min..=max)
}

/// A one-way link latency in milliseconds: 0 to 10 s.
pub(crate) fn latency_ms(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(value) if value.is_finite() && (0.0..=10_000.0).contains(&value) => Ok(value),
        _ => Err("must be a latency from 0 to 10000 milliseconds".to_owned()),
    }
}

/// A link's bandwidth in megabits per second: above 0, at most 10 Tbit/s.
pub(crate) fn bandwidth_mbit(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(value) if value.is_finite() && value > 0.0 && value <= 10_000_000.0 => Ok(value),
        _ => Err("must be a bandwidth above 0 and at most 10000000 Mbit/s".to_owned()),
    }
}

/// A snapshot window in seconds: 0 (versions are collected as soon as no client reads
/// them) to a day.
pub(crate) fn snapshot_window(text: &str) -> Result<std::time::Duration, String> {
    let max = virga_dkv::shard::MAX_SNAPSHOT_WINDOW.as_secs_f64();
    match text.parse::<f64>() {
        Ok(value) if value.is_finite() && (0.0..=max).contains(&value) => Ok(std::time::Duration::from_secs_f64(value)),
        _ => Err(format!("must be a number of seconds from 0 to {max}")),
    }
}
