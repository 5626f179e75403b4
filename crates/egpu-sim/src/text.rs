//! Turning a trace file's bytes into text the CSV and JSON readers take,
//! and finding the line a reader's byte offset is on.
//!
//! Shared by the openb loaders ([`crate::trace`]) and the usage loaders
//! ([`crate::elastic::load`]), so both accept the same files: plain or
//! gzip, with or without a UTF-8 byte-order mark, and with a bad byte
//! pointed at by its line.

use std::io::Read;

/// Most bytes a gzip file may unpack to (a few hundred times any trace the
/// evaluation's grid bound lets through), so a small hostile file cannot
/// exhaust memory.
const MAX_UNPACKED: u64 = 4 << 30;

/// Text of a file: gunzipped if it starts with the gzip magic, without a
/// leading byte-order mark. Bytes that are not UTF-8 are an error naming
/// the first such line (1-based) unless `lenient`: then every line that
/// holds one is blanked (the readers skip blank lines, and the other lines
/// keep their numbers) and counted in the second value.
pub fn decode(bytes: &[u8], lenient: bool) -> Result<(String, usize), (u64, String)> {
    decode_within(bytes, lenient, MAX_UNPACKED)
}

/// [`decode`] with a gzip file unpacking to at most `max` bytes.
fn decode_within(bytes: &[u8], lenient: bool, max: u64) -> Result<(String, usize), (u64, String)> {
    let unpacked;
    let bytes = if bytes.starts_with(&GZIP_MAGIC) {
        unpacked = gunzip(bytes, max)?;
        &unpacked[..]
    } else {
        bytes
    };
    let bytes = bytes.strip_prefix("\u{feff}".as_bytes()).unwrap_or(bytes);
    match std::str::from_utf8(bytes) {
        Ok(s) => Ok((s.to_string(), 0)),
        Err(e) if !lenient => {
            let at = e.valid_up_to();
            Err((line_at(bytes, at), "not UTF-8 text: save the file as UTF-8, or pass --lenient to skip the lines that are not".to_string()))
        }
        Err(_) => {
            let mut out = String::with_capacity(bytes.len());
            let mut bad = 0;
            for (k, line) in split_lines(bytes).enumerate() {
                match std::str::from_utf8(line) {
                    Ok(s) => out.push_str(s),
                    // Without its header no row could be read.
                    Err(_) if k == 0 => return Err((1, "the header line is not UTF-8 text: save the file as UTF-8".to_string())),
                    // Blanked, with its line end kept, so the lines after
                    // it keep their numbers.
                    Err(_) => {
                        bad += 1;
                        let body = line.strip_suffix(b"\n").unwrap_or(line);
                        let body = body.strip_suffix(b"\r").unwrap_or(body);
                        out.push_str(std::str::from_utf8(&line[body.len()..]).unwrap_or_default());
                    }
                }
            }
            Ok((out, bad))
        }
    }
}

const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];

/// The bytes of a gzip file: every member of it (files concatenated with
/// `cat` are one file to `gzip -d`), at most `max` bytes. Zeros after the
/// last member (padding a copy or a tape left) are passed over as gzip
/// passes them; other bytes there are refused, not dropped unseen, since
/// they may be a damaged member holding the rest of the trace.
fn gunzip(bytes: &[u8], max: u64) -> Result<Vec<u8>, (u64, String)> {
    let too_large = || {
        let bound = if max >= 1 << 30 { format!("{} GiB", max >> 30) } else { format!("{max} bytes") };
        (0, format!("decompresses to more than {bound}: split the trace, or give it a shorter range"))
    };
    let mut out = Vec::new();
    let mut rest = bytes;
    loop {
        let at = bytes.len() - rest.len();
        let mut member = flate2::bufread::GzDecoder::new(rest);
        let room = (max + 1).saturating_sub(out.len() as u64);
        (&mut member).take(room).read_to_end(&mut out).map_err(|e| {
            let why = if e.kind() == std::io::ErrorKind::UnexpectedEof { "the gzip data ends early: the file is truncated (an interrupted copy or download?) or damaged".to_string() } else { format!("cannot decompress: {e}") };
            (0, if at > 0 { format!("{why} (in the gzip member at byte {at})") } else { why })
        })?;
        if out.len() as u64 > max {
            return Err(too_large());
        }
        rest = member.into_inner();
        if rest.iter().all(|&b| b == 0) {
            return Ok(out);
        }
        if !rest.starts_with(&GZIP_MAGIC) {
            let at = bytes.len() - rest.len();
            return Err((0, format!("{} bytes after the end of the gzip data (from byte {at}) are not gzip: the file is damaged or has something appended; `zcat` it into a plain file to see what is there and keep what is good", rest.len())));
        }
    }
}

/// The 1-based line that byte `at` of `bytes` is on.
fn line_at(bytes: &[u8], at: usize) -> u64 {
    1 + line_ends(&bytes[..at.min(bytes.len())])
}

/// Line ends in `bytes`: `\n`, `\r\n`, or a `\r` alone (as the CSV reader
/// and editors take them).
fn line_ends(bytes: &[u8]) -> u64 {
    bytes.iter().enumerate().filter(|&(i, &b)| b == b'\n' || (b == b'\r' && bytes.get(i + 1) != Some(&b'\n'))).count() as u64
}

/// `bytes` cut into lines, each with its line end (`\n`, `\r\n` or a lone
/// `\r`, as [`line_ends`] counts them); the last may have none. A line end
/// is never inside a UTF-8 character (its bytes are all above 0x7f).
fn split_lines(bytes: &[u8]) -> impl Iterator<Item = &[u8]> {
    let mut rest = bytes;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let end = match rest.iter().position(|&b| b == b'\n' || b == b'\r') {
            Some(i) if rest[i] == b'\r' && rest.get(i + 1) == Some(&b'\n') => i + 2,
            Some(i) => i + 1,
            None => rest.len(),
        };
        let (line, tail) = rest.split_at(end);
        rest = tail;
        Some(line)
    })
}

/// Lines of a text by byte offset, for readers whose own line count is off
/// (the `csv` crate miscounts after `\r\n` and blank lines). Offsets are
/// asked in increasing order, as a reader goes, so the whole file is
/// scanned once; an offset behind the last one is counted from the start.
pub struct Lines<'a> {
    bytes: &'a [u8],
    at: usize,
    line: u64,
}

impl<'a> Lines<'a> {
    pub fn new(text: &'a str) -> Lines<'a> {
        Lines { bytes: text.as_bytes(), at: 0, line: 1 }
    }

    /// The 1-based line of the record that starts at byte `byte`. The
    /// reader may give a record's start before the line ends it passed
    /// over (the `\n` of a `\r\n`, blank lines), so those are skipped.
    pub fn line(&mut self, byte: u64) -> u64 {
        let mut byte = (byte as usize).min(self.bytes.len());
        while matches!(self.bytes.get(byte), Some(b'\r' | b'\n')) {
            byte += 1;
        }
        if byte < self.at {
            (self.at, self.line) = (0, 1);
        }
        // Both ends sit on a record's first byte (or the end), never
        // inside a `\r\n`, so each line end is counted once.
        self.line += line_ends(&self.bytes[self.at..byte]);
        self.at = byte;
        self.line
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_counted_by_byte_whatever_the_line_ends() {
        let text = "a\r\nb\n\n\nc\r\n";
        let mut l = Lines::new(text);
        assert_eq!(l.line(0), 1);
        assert_eq!(l.line(3), 2);
        assert_eq!(l.line(2), 2, "a start before a line's end is the next line's");
        assert_eq!(l.line(5), 5, "blank lines are passed over");
        assert_eq!(l.line(text.find('c').unwrap() as u64), 5);
        assert_eq!(l.line(3), 2, "backwards recounts");
        assert_eq!(l.line(1_000), 6, "past the end: the line after the last line end");
        // A `\r` alone ends a line too, as the CSV reader takes it.
        let mut l = Lines::new("h\ra\rb\r");
        assert_eq!(l.line(2), 2);
        assert_eq!(l.line(4), 3);
    }

    #[test]
    fn bad_bytes_name_their_line_or_blank_it() {
        let bytes = b"h\nok\nb\xffd\nok\n";
        assert_eq!(decode(bytes, false).unwrap_err().0, 3);
        let (text, bad) = decode(bytes, true).unwrap();
        assert_eq!((text.as_str(), bad), ("h\nok\n\nok\n", 1));
        assert_eq!(decode(b"h\xff\nok\n", true).unwrap_err().0, 1, "no file without its header");
        // Every line end the line count knows: a lone `\r` too, and a
        // `\r\n` kept whole.
        let bytes = b"h\rok\rb\xffd\rok\r";
        assert_eq!(decode(bytes, false).unwrap_err().0, 3);
        let (text, bad) = decode(bytes, true).unwrap();
        assert_eq!((text.as_str(), bad), ("h\rok\r\rok\r", 1));
        let (text, bad) = decode(b"h\r\nb\xff\r\nok\nb\xff\rc\xff", true).unwrap();
        assert_eq!((text.as_str(), bad), ("h\r\n\r\nok\n\r", 3));
        assert_eq!(line_ends(text.as_bytes()), 4, "the lines keep their numbers");
        assert_eq!(split_lines(b"a\r\r\nb\n\nc").collect::<Vec<_>>(), [&b"a\r"[..], b"\r\n", b"b\n", b"\n", b"c"]);
        let (text, bad) = decode("\u{feff}x,y\n".as_bytes(), false).unwrap();
        assert_eq!((text.as_str(), bad), ("x,y\n", 0));
    }

    #[test]
    fn gzip_is_unpacked() {
        let (text, _) = decode(&gz(b"x,y\n1,2\n"), false).unwrap();
        assert_eq!(text, "x,y\n1,2\n");
        assert!(decode(&[0x1f, 0x8b, 0, 1], false).unwrap_err().1.contains("ends early: the file is truncated"));
        // A file that unpacks past the bound is refused, not read on.
        let small = gz(&[b'0'; 4096]);
        assert_eq!(decode_within(&small, false, 4096).unwrap().0.len(), 4096);
        let e = decode_within(&small, false, 4095).unwrap_err().1;
        assert!(e.contains("decompresses to more than"), "{e}");
        // The bound holds over all the members together.
        let two = [small.clone(), small.clone()].concat();
        assert_eq!(decode_within(&two, false, 8192).unwrap().0.len(), 8192);
        assert!(decode_within(&two, false, 8191).unwrap_err().1.contains("decompresses to more than"));
    }

    fn gz(text: &[u8]) -> Vec<u8> {
        use std::io::Write;
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(text).unwrap();
        gz.finish().unwrap()
    }

    #[test]
    fn gzip_members_are_all_read_and_bytes_after_them_are_judged() {
        let (a, b) = (gz(b"x,y\n1,2\n"), gz(b"3,4\n"));
        // Concatenated members are one file, as `cat a.gz b.gz` makes it.
        let (text, _) = decode(&[a.clone(), b.clone()].concat(), false).unwrap();
        assert_eq!(text, "x,y\n1,2\n3,4\n");
        // Zero padding after the last member is passed over.
        let (text, _) = decode(&[a.clone(), vec![0; 512]].concat(), false).unwrap();
        assert_eq!(text, "x,y\n1,2\n");
        // Anything else after it is refused with where it starts.
        let e = decode(&[a.clone(), b"junk".to_vec()].concat(), false).unwrap_err().1;
        assert!(e.contains(&format!("4 bytes after the end of the gzip data (from byte {})", a.len())) && e.contains("zcat"), "{e}");
        // A truncated file says so, cut in its trailer or in its data, also
        // in a later member.
        let e = decode(&a[..a.len() - 3], false).unwrap_err().1;
        assert!(e.contains("ends early: the file is truncated"), "{e}");
        let long = gz(&(0..20_000u32).map(|i| i.to_string()).collect::<Vec<_>>().join("\n").into_bytes());
        let e = decode(&long[..long.len() / 2], false).unwrap_err().1;
        assert!(e.contains("ends early: the file is truncated"), "{e}");
        let e = decode(&[a.clone(), b[..b.len() - 5].to_vec()].concat(), false).unwrap_err().1;
        assert!(e.contains("truncated") && e.contains(&format!("member at byte {}", a.len())), "{e}");
        // A damaged member (a flipped byte of its checksum) fails its check.
        let mut bad = a.clone();
        let crc = bad.len() - 8;
        bad[crc] ^= 0xff;
        let e = decode(&bad, false).unwrap_err().1;
        assert!(e.contains("cannot decompress"), "{e}");
    }
}
