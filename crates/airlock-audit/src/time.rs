//! RFC 3339 times, brought to the one form the store compares as text.
//!
//! Records carry `started_at` as `YYYY-MM-DDTHH:MM:SS.mmmZ` (UTC, to the
//! millisecond), and text in that form sorts in time order. Filters may be
//! written with an offset, without fractions, or as a bare date; they are
//! brought to the same form before they are compared.

use std::time::{Duration, UNIX_EPOCH};

use airlock_core::record::format_rfc3339;

/// `text` in the store's form, or `None` when it is not an RFC 3339 time
/// (or a bare `YYYY-MM-DD`, read as midnight UTC). A time before 1970 is
/// read as 1970-01-01, before which no run was recorded: as a filter it
/// means the same.
pub(crate) fn normalize(text: &str) -> Option<String> {
    let millis = parse_millis(text)?.max(0).unsigned_abs();
    Some(format_rfc3339(UNIX_EPOCH + Duration::from_millis(millis)))
}

/// Milliseconds since the Unix epoch.
fn parse_millis(text: &str) -> Option<i64> {
    let bytes = text.as_bytes();
    let year = digits(bytes, 0, 4)?;
    let month = digits(bytes, 5, 2)?;
    let day = digits(bytes, 8, 2)?;
    if bytes.get(4) != Some(&b'-') || bytes.get(7) != Some(&b'-') {
        return None;
    }
    if !(1..=12).contains(&month) || day < 1 || day > days_in_month(year, month) {
        return None;
    }
    let date_ms = days_from_civil(year, month, day) * 86_400_000;
    if bytes.len() == 10 {
        return Some(date_ms);
    }
    if !matches!(bytes.get(10), Some(b'T' | b't' | b' '))
        || bytes.get(13) != Some(&b':')
        || bytes.get(16) != Some(&b':')
    {
        return None;
    }
    let (hour, minute, second) = (digits(bytes, 11, 2)?, digits(bytes, 14, 2)?, digits(bytes, 17, 2)?);
    // 60 is a leap second; it counts as the first second of the next minute.
    if hour > 23 || minute > 59 || second > 60 {
        return None;
    }
    let mut rest = &bytes[19..];
    let mut millis = 0;
    if let Some(fraction) = rest.strip_prefix(b".") {
        let count = fraction.iter().take_while(|b| b.is_ascii_digit()).count();
        if count == 0 {
            return None;
        }
        // Milliseconds: the first three digits, padded; finer digits are dropped.
        let kept = &fraction[..count.min(3)];
        millis = kept.iter().fold(0, |value, d| value * 10 + i64::from(d - b'0')) * [100, 10, 1][kept.len() - 1];
        rest = &fraction[count..];
    }
    let offset_minutes = match rest {
        b"Z" | b"z" => 0,
        [sign @ (b'+' | b'-'), h1, h2, b':', m1, m2] => {
            let hours = digits(&[*h1, *h2], 0, 2)?;
            let minutes = digits(&[*m1, *m2], 0, 2)?;
            if hours > 23 || minutes > 59 {
                return None;
            }
            let magnitude = hours * 60 + minutes;
            if *sign == b'-' { -magnitude } else { magnitude }
        }
        _ => return None,
    };
    let time_ms = ((hour * 60 + minute - offset_minutes) * 60 + second) * 1000 + millis;
    Some(date_ms + time_ms)
}

fn digits(bytes: &[u8], start: usize, count: usize) -> Option<i64> {
    let field = bytes.get(start..start + count)?;
    field.iter().try_fold(0i64, |value, b| b.is_ascii_digit().then(|| value * 10 + i64::from(b - b'0')))
}

fn days_in_month(year: i64, month: i64) -> i64 {
    match month {
        2 if year % 4 == 0 && (year % 100 != 0 || year % 400 == 0) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days since 1970-01-01 of a proleptic Gregorian date, after Howard
/// Hinnant's algorithm (the inverse of the one in airlock-core).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let year_of_era = year - era * 400;
    let month_from_march = (month + 9) % 12;
    let day_of_year = (153 * month_from_march + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn brings_every_form_to_utc_milliseconds() {
        let cases = [
            ("2026-11-29T09:04:05.123Z", "2026-11-29T09:04:05.123Z"),
            ("2026-11-29t09:04:05z", "2026-11-29T09:04:05.000Z"),
            ("2026-11-29 09:04:05.1Z", "2026-11-29T09:04:05.100Z"),
            ("2026-11-29T09:04:05.123456789Z", "2026-11-29T09:04:05.123Z"),
            ("2026-11-29T10:34:05+01:30", "2026-11-29T09:04:05.000Z"),
            ("2026-11-28T23:04:05-10:00", "2026-11-29T09:04:05.000Z"),
            ("2026-11-29", "2026-11-29T00:00:00.000Z"),
            ("2000-02-29T00:00:00Z", "2000-02-29T00:00:00.000Z"),
            ("1970-01-01T00:00:00Z", "1970-01-01T00:00:00.000Z"),
            ("2016-12-31T23:59:60Z", "2017-01-01T00:00:00.000Z"),
            ("1969-12-31T23:59:59Z", "1970-01-01T00:00:00.000Z"),
            ("0107-02-12", "1970-01-01T00:00:00.000Z"),
        ];
        for (input, expected) in cases {
            assert_eq!(normalize(input).as_deref(), Some(expected), "{input}");
        }
    }

    #[test]
    fn refuses_what_is_not_a_time() {
        for bad in [
            "",
            "yesterday",
            "2026-13-01",
            "2026-02-29",
            "1900-02-29T00:00:00Z",
            "2026-11-31",
            "2026-11-29T24:00:00Z",
            "2026-11-29T09:04:05",
            "2026-11-29T09:04:05.Z",
            "2026-11-29T09:04:05+0100",
            "2026-11-29T09:04:05+01:00x",
            "+2026-11-29",
            "2026-1-29",
        ] {
            assert_eq!(normalize(bad), None, "{bad:?} should be refused");
        }
    }
}
