//! Shared CSV machinery: opening (plain or gzip), header lookup, and typed field access
//! that turns every bad value into a located [`TraceError`].
//!
//! Records are read into one reused [`csv::ByteRecord`], so a loader allocates only for
//! what it keeps (names, interned ids), not per field.

use std::fs::File;
use std::io::{self, BufRead, BufReader, Read};
use std::path::Path;

use flate2::bufread::MultiGzDecoder;

use crate::error::{Result, TraceError};

/// The most seconds a time or duration of a trace may hold: 9999-12-31 23:59:59 as a Unix
/// time. Every real trace is far below it, and a simulator can turn it into milliseconds
/// and add two of them without overflowing.
pub const MAX_TRACE_SECONDS: u64 = 253_402_300_799;

/// The two magic bytes every gzip member starts with.
const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];

/// Large enough that decompression and CSV parsing are not dominated by read syscalls.
const READ_BUFFER_BYTES: usize = 64 * 1024;

/// A trace file opened for reading, decompressed on the fly when it is gzip.
///
/// Returned by [`open_trace`]; it is a plain [`Read`] of CSV text either way.
pub struct TraceReader {
    inner: TraceReaderInner,
}

enum TraceReaderInner {
    Plain(BufReader<File>),
    Gzip(Box<MultiGzDecoder<BufReader<File>>>),
}

impl Read for TraceReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match &mut self.inner {
            TraceReaderInner::Plain(reader) => reader.read(buf),
            TraceReaderInner::Gzip(reader) => reader.read(buf),
        }
    }
}

/// Opens a trace file, detecting gzip by its magic bytes rather than by the file name, so a
/// renamed or decompressed copy loads the same way.
pub fn open_trace(path: &Path) -> Result<TraceReader> {
    let io_error = |source| TraceError::Io {
        file: path.to_path_buf(),
        source,
    };
    let file = File::open(path).map_err(io_error)?;
    let mut buffered = BufReader::with_capacity(READ_BUFFER_BYTES, file);
    let is_gzip = buffered
        .fill_buf()
        .map_err(io_error)?
        .starts_with(&GZIP_MAGIC);
    let inner = if is_gzip {
        TraceReaderInner::Gzip(Box::new(MultiGzDecoder::new(buffered)))
    } else {
        TraceReaderInner::Plain(buffered)
    };
    Ok(TraceReader { inner })
}

/// The most bytes one record (the header included) may span. Real traces' records are
/// under 200 bytes; a file that is one endless line — a binary file, a log, `/dev/zero`
/// named by mistake — must end in an error, not in a record buffer that grows without
/// end.
pub const MAX_RECORD_BYTES: u64 = 1 << 20;

/// The error a [`RecordBound`] reader returns once a record outgrows [`MAX_RECORD_BYTES`].
#[derive(Debug)]
struct RecordTooLong;

impl std::fmt::Display for RecordTooLong {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "a record longer than {} MiB (a trace's records are short lines of CSV: is this \
             the right file?)",
            MAX_RECORD_BYTES >> 20
        )
    }
}

impl std::error::Error for RecordTooLong {}

/// A reader that fails once more bytes are read without [`Table::next_row`] completing a
/// record than a record may span plus one read-ahead of the CSV reader's buffer: every
/// record of at most [`MAX_RECORD_BYTES`] passes, and a longer one is an error before its
/// buffer grows much past the bound.
struct RecordBound<R> {
    inner: R,
    left: u64,
}

impl<R> RecordBound<R> {
    const ALLOWANCE: u64 = MAX_RECORD_BYTES + READ_BUFFER_BYTES as u64;

    fn new(inner: R) -> Self {
        RecordBound {
            inner,
            left: Self::ALLOWANCE,
        }
    }

    /// A record ended: the next one gets the whole allowance.
    fn record_ended(&mut self) {
        self.left = Self::ALLOWANCE;
    }
}

impl<R: Read> Read for RecordBound<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.left == 0 {
            return Err(io::Error::new(io::ErrorKind::InvalidData, RecordTooLong));
        }
        let most = buf
            .len()
            .min(usize::try_from(self.left).unwrap_or(usize::MAX));
        let read = self.inner.read(&mut buf[..most])?;
        self.left -= read as u64;
        Ok(read)
    }
}

/// Whether a CSV error is a [`RecordBound`]'s refusal.
fn is_record_too_long(error: &io::Error) -> bool {
    error
        .get_ref()
        .is_some_and(|inner| inner.is::<RecordTooLong>())
}

/// A column the loader found in the header: its index and its name (for error messages).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Column {
    index: usize,
    name: &'static str,
}

/// A CSV table being read record by record.
pub(crate) struct Table<'f, R> {
    reader: csv::Reader<RecordBound<R>>,
    headers: csv::ByteRecord,
    record: csv::ByteRecord,
    file: &'f Path,
}

impl<'f, R: Read> Table<'f, R> {
    /// Reads the header line. `file` labels errors; it is not opened here.
    pub(crate) fn new(source: R, file: &'f Path) -> Result<Self> {
        let mut reader = csv::ReaderBuilder::new()
            .has_headers(true)
            // Every record must have as many fields as the header: a short or long row is
            // reported, never padded or truncated.
            .flexible(false)
            // `name, cpu_milli` and ` 12000` as hand-edited or exported files write them:
            // whitespace around a field is never part of a trace's value.
            .trim(csv::Trim::All)
            .buffer_capacity(READ_BUFFER_BYTES)
            .from_reader(RecordBound::new(source));
        let headers = reader
            .byte_headers()
            .map_err(|error| csv_error(file, error))?
            .clone();
        reader.get_mut().record_ended();
        if headers.is_empty() {
            return Err(TraceError::Empty {
                file: file.to_path_buf(),
            });
        }
        Ok(Table {
            reader,
            headers,
            record: csv::ByteRecord::new(),
            file,
        })
    }

    /// The header's column names, as the loaders match them (byte-order mark removed,
    /// quotes and surrounding whitespace gone).
    pub(crate) fn column_names(&self) -> Vec<String> {
        self.headers
            .iter()
            .map(|header| String::from_utf8_lossy(strip_bom(header)).into_owned())
            .collect()
    }

    /// The column called `name`, if the header has it.
    pub(crate) fn column(&self, name: &'static str) -> Option<Column> {
        self.headers
            .iter()
            .position(|header| strip_bom(header) == name.as_bytes())
            .map(|index| Column { index, name })
    }

    /// The column called `name`, or a [`TraceError::MissingColumn`].
    pub(crate) fn require(&self, name: &'static str) -> Result<Column> {
        self.column(name).ok_or_else(|| self.missing(name))
    }

    /// The error for a header that lacks `name`.
    pub(crate) fn missing(&self, name: &'static str) -> TraceError {
        TraceError::MissingColumn {
            file: self.file.to_path_buf(),
            column: name.to_string(),
        }
    }

    /// The next record, or `None` at the end of the input. Blank lines are skipped by the
    /// CSV reader (the Philly export ends with one).
    pub(crate) fn next_row(&mut self) -> Result<Option<Row<'_>>> {
        let read = self.reader.read_byte_record(&mut self.record);
        self.reader.get_mut().record_ended();
        match read {
            Ok(false) => Ok(None),
            Ok(true) => {
                let line = self.record.position().map_or(0, csv::Position::line);
                Ok(Some(Row {
                    record: &self.record,
                    file: self.file,
                    line,
                }))
            }
            Err(error) => Err(self.located(error)),
        }
    }

    /// A read error inside the file (a gzip stream cut short, a disk error) as the record
    /// it stopped: the CSV reader stamps a record with its start before reading it.
    fn located(&self, error: csv::Error) -> TraceError {
        match error.kind() {
            csv::ErrorKind::Io(source) => TraceError::Record {
                file: self.file.to_path_buf(),
                line: self.record.position().map_or(2, csv::Position::line),
                reason: if is_record_too_long(source) {
                    source.to_string()
                } else {
                    format!("read error: {source} (a truncated or damaged file?)")
                },
            },
            _ => csv_error(self.file, error),
        }
    }
}

/// The column names of a trace's header, read as every loader reads them: a table's format
/// can be told from this without a second, looser parser.
///
/// ```
/// let names = arbiter_traces::read_header_columns(
///     "\u{feff}\"name\", cpu_milli ,num_gpu\npod-a,1000,1\n".as_bytes(),
///     std::path::Path::new("pods.csv"),
/// )?;
/// assert_eq!(names, ["name", "cpu_milli", "num_gpu"]);
/// # Ok::<(), arbiter_traces::TraceError>(())
/// ```
pub fn read_header_columns(source: impl Read, file: &Path) -> Result<Vec<String>> {
    Ok(Table::new(source, file)?.column_names())
}

/// [`read_header_columns`] of a file, plain or gzip.
pub fn header_columns(path: &Path) -> Result<Vec<String>> {
    read_header_columns(open_trace(path)?, path)
}

/// A UTF-8 byte-order mark some spreadsheet exports put before the first header.
fn strip_bom(field: &[u8]) -> &[u8] {
    field.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(field)
}

fn csv_error(file: &Path, error: csv::Error) -> TraceError {
    let line = error.position().map_or(0, csv::Position::line);
    let message = error.to_string();
    match error.into_kind() {
        // Only the header is read here (records go through `Table::located`).
        csv::ErrorKind::Io(source) if is_record_too_long(&source) => TraceError::Record {
            file: file.to_path_buf(),
            line: 1,
            reason: source.to_string(),
        },
        csv::ErrorKind::Io(source) => TraceError::Io {
            file: file.to_path_buf(),
            source,
        },
        csv::ErrorKind::UnequalLengths {
            pos,
            expected_len,
            len,
        } => TraceError::Record {
            file: file.to_path_buf(),
            line: pos.map_or(line, |pos| pos.line()),
            reason: format!("expected {expected_len} fields (as in the header), found {len}"),
        },
        // UTF-8 and deserialization errors cannot arise from byte records; report any
        // other kind with the CSV reader's own wording.
        _ => TraceError::Record {
            file: file.to_path_buf(),
            line,
            reason: message,
        },
    }
}

/// One record, borrowed from its [`Table`], with typed accessors.
pub(crate) struct Row<'r> {
    record: &'r csv::ByteRecord,
    file: &'r Path,
    line: u64,
}

impl Row<'_> {
    /// The raw bytes of a field. The header fixes the field count, so every column index
    /// is in range; an empty slice is returned defensively rather than panicking.
    pub(crate) fn raw(&self, column: Column) -> &[u8] {
        self.record.get(column.index).unwrap_or_default()
    }

    /// An error about `column` in this record, quoting its value.
    pub(crate) fn error(&self, column: Column, reason: impl Into<String>) -> TraceError {
        TraceError::Field {
            file: self.file.to_path_buf(),
            line: self.line,
            column: column.name.to_string(),
            value: String::from_utf8_lossy(self.raw(column)).into_owned(),
            reason: reason.into(),
        }
    }

    /// The field as UTF-8 text.
    pub(crate) fn text(&self, column: Column) -> Result<&str> {
        std::str::from_utf8(self.raw(column)).map_err(|_| self.error(column, "invalid UTF-8"))
    }

    /// The field as a non-empty owned string.
    pub(crate) fn required_string(&self, column: Column) -> Result<String> {
        let text = self.text(column)?;
        if text.is_empty() {
            return Err(self.error(column, "empty value"));
        }
        Ok(text.to_string())
    }

    /// A non-negative integer written as plain decimal digits.
    pub(crate) fn unsigned<T: TryFrom<u64>>(&self, column: Column) -> Result<T> {
        self.unsigned_or_empty(column)?
            .ok_or_else(|| self.error(column, "empty value"))
    }

    /// Like [`Row::unsigned`], but an empty field is `None`.
    pub(crate) fn unsigned_or_empty<T: TryFrom<u64>>(&self, column: Column) -> Result<Option<T>> {
        let bytes = self.raw(column);
        if bytes.is_empty() {
            return Ok(None);
        }
        let value =
            parse_decimal_digits(bytes).ok_or_else(|| self.error(column, "invalid integer"))?;
        T::try_from(value)
            .map(Some)
            .map_err(|_| self.error(column, "integer out of range"))
    }

    /// A time or duration in whole seconds, at most [`MAX_TRACE_SECONDS`].
    pub(crate) fn seconds(&self, column: Column) -> Result<u64> {
        self.seconds_or_empty(column)?
            .ok_or_else(|| self.error(column, "empty value"))
    }

    /// Like [`Row::seconds`], but an empty field is `None`.
    pub(crate) fn seconds_or_empty(&self, column: Column) -> Result<Option<u64>> {
        let value = self.unsigned_or_empty::<u64>(column)?;
        match value {
            Some(v) if v > MAX_TRACE_SECONDS => Err(self.too_many_seconds(column)),
            _ => Ok(value),
        }
    }

    /// A duration in seconds, written as a real, at most [`MAX_TRACE_SECONDS`].
    pub(crate) fn real_seconds(&self, column: Column) -> Result<f64> {
        let value = self.non_negative_real(column)?;
        if value > MAX_TRACE_SECONDS as f64 {
            return Err(self.too_many_seconds(column));
        }
        Ok(value)
    }

    fn too_many_seconds(&self, column: Column) -> TraceError {
        self.error(
            column,
            format!("more than {MAX_TRACE_SECONDS} seconds (the end of the year 9999)"),
        )
    }

    /// A finite, non-negative real number.
    pub(crate) fn non_negative_real(&self, column: Column) -> Result<f64> {
        self.non_negative_real_or_empty(column)?
            .ok_or_else(|| self.error(column, "empty value"))
    }

    /// Like [`Row::non_negative_real`], but an empty field is `None`.
    pub(crate) fn non_negative_real_or_empty(&self, column: Column) -> Result<Option<f64>> {
        let bytes = self.raw(column);
        if bytes.is_empty() {
            return Ok(None);
        }
        let value: f64 = std::str::from_utf8(bytes)
            .ok()
            .and_then(|text| text.parse().ok())
            .ok_or_else(|| self.error(column, "invalid number"))?;
        // `str::parse` accepts "NaN" and "inf"; neither is a meaningful duration or load.
        if !value.is_finite() {
            return Err(self.error(column, "number is not finite"));
        }
        if value < 0.0 {
            return Err(self.error(column, "negative number"));
        }
        Ok(Some(value))
    }

    /// A count written as a real with no fractional part (pandas writes integer columns
    /// that held a missing value as `4.0`).
    pub(crate) fn whole_real_or_empty<T: TryFrom<u64>>(&self, column: Column) -> Result<Option<T>> {
        let Some(value) = self.non_negative_real_or_empty(column)? else {
            return Ok(None);
        };
        if value.fract() != 0.0 {
            return Err(self.error(column, "expected a whole number"));
        }
        // Every whole f64 below 2^64 converts exactly; larger ones are out of range.
        if value >= 18_446_744_073_709_551_616.0 {
            return Err(self.error(column, "integer out of range"));
        }
        T::try_from(value as u64)
            .map(Some)
            .map_err(|_| self.error(column, "integer out of range"))
    }

    /// A timestamp in seconds written as a whole real (`1662858720.0`).
    pub(crate) fn whole_seconds(&self, column: Column) -> Result<i64> {
        let value = self
            .whole_real_or_empty::<i64>(column)?
            .ok_or_else(|| self.error(column, "empty value"))?;
        if value > MAX_TRACE_SECONDS as i64 {
            return Err(self.too_many_seconds(column));
        }
        Ok(value)
    }

    /// A `YYYY-MM-DD HH:MM:SS` wall-clock time, as seconds since 1970-01-01 00:00:00 on the
    /// same clock (the traces do not name a time zone, so none is applied).
    pub(crate) fn datetime(&self, column: Column) -> Result<i64> {
        parse_datetime(self.raw(column))
            .ok_or_else(|| self.error(column, "invalid date-time (expected YYYY-MM-DD HH:MM:SS)"))
    }
}

/// Parses ASCII decimal digits without going through `str` (no sign, no spaces). `None` on
/// an empty input, any other byte, or overflow.
fn parse_decimal_digits(bytes: &[u8]) -> Option<u64> {
    if bytes.is_empty() {
        return None;
    }
    bytes.iter().try_fold(0u64, |value, &byte| {
        let digit = byte.checked_sub(b'0').filter(|digit| *digit <= 9)?;
        value.checked_mul(10)?.checked_add(u64::from(digit))
    })
}

/// Parses `YYYY-MM-DD HH:MM:SS` into seconds since the Unix epoch of the same clock.
pub(crate) fn parse_datetime(bytes: &[u8]) -> Option<i64> {
    let &[
        y0,
        y1,
        y2,
        y3,
        b'-',
        mo0,
        mo1,
        b'-',
        d0,
        d1,
        b' ',
        h0,
        h1,
        b':',
        mi0,
        mi1,
        b':',
        s0,
        s1,
    ] = bytes
    else {
        return None;
    };
    let number = |digits: &[u8]| parse_decimal_digits(digits).and_then(|v| i64::try_from(v).ok());
    let year = number(&[y0, y1, y2, y3])?;
    let month = number(&[mo0, mo1])?;
    let day = number(&[d0, d1])?;
    let hour = number(&[h0, h1])?;
    let minute = number(&[mi0, mi1])?;
    let second = number(&[s0, s1])?;
    if !(1..=12).contains(&month)
        || day < 1
        || day > days_in_month(year, month)
        || hour > 23
        || minute > 59
        || second > 59
    {
        return None;
    }
    Some(days_from_civil(year, month, day) * 86_400 + hour * 3_600 + minute * 60 + second)
}

fn days_in_month(year: i64, month: i64) -> i64 {
    match month {
        2 if year % 4 == 0 && (year % 100 != 0 || year % 400 == 0) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days from 1970-01-01 to the given proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let year_of_era = year - era * 400;
    let shifted_month = (month + 9) % 12; // March = 0, so the leap day ends the year.
    let day_of_year = (153 * shifted_month + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

/// Interns short repeated identifiers (cluster names, container ids) so each row stores a
/// small index instead of its own `String`.
#[derive(Default)]
pub(crate) struct Interner {
    names: Vec<String>,
    index_by_name: std::collections::HashMap<Box<[u8]>, u32>,
}

impl Interner {
    /// The index of `name`, adding it on first sight. `None` if more than `u32::MAX`
    /// distinct names were seen (not reachable with real traces, but input is untrusted).
    pub(crate) fn intern(&mut self, name: &str) -> Option<u32> {
        if let Some(&index) = self.index_by_name.get(name.as_bytes()) {
            return Some(index);
        }
        let index = u32::try_from(self.names.len()).ok()?;
        self.names.push(name.to_string());
        self.index_by_name.insert(name.as_bytes().into(), index);
        Some(index)
    }

    pub(crate) fn into_names(self) -> Vec<String> {
        self.names
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn datetime_matches_known_unix_times() {
        assert_eq!(parse_datetime(b"1970-01-01 00:00:00"), Some(0));
        assert_eq!(parse_datetime(b"2017-10-09 07:01:55"), Some(1_507_532_515));
        assert_eq!(parse_datetime(b"2024-02-29 23:59:59"), Some(1_709_251_199));
        assert_eq!(parse_datetime(b"2023-02-29 00:00:00"), None);
        assert_eq!(parse_datetime(b"2017-13-01 00:00:00"), None);
        assert_eq!(parse_datetime(b"2017-10-09T07:01:55"), None);
        assert_eq!(parse_datetime(b"2017-10-09 07:01:5"), None);
    }

    #[test]
    fn decimal_digits_reject_signs_and_overflow() {
        assert_eq!(parse_decimal_digits(b"0"), Some(0));
        assert_eq!(
            parse_decimal_digits(b"18446744073709551615"),
            Some(u64::MAX)
        );
        assert_eq!(parse_decimal_digits(b"18446744073709551616"), None);
        assert_eq!(parse_decimal_digits(b"+1"), None);
        assert_eq!(parse_decimal_digits(b"-1"), None);
        assert_eq!(parse_decimal_digits(b" 1"), None);
        assert_eq!(parse_decimal_digits(b""), None);
    }
}
