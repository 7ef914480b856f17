//! This module owns reading etcd's bolt database (`member/snap/db`)
//! without bolt: the two meta pages (magic `0xED0CDAED`, version 2, FNV-1a
//! checksum; the valid one with the higher txid wins), then lookups in
//! the B+tree of branch and leaf pages, inline buckets and overflow pages,
//! as bbolt's `page.go`, `bucket.go` and `db.go` (v1.3) lay them out
//! (little-endian, as on every platform etcd ships for). Pages are read
//! with `pread` through a few windows of the file a megabyte wide, so a walk of
//! a whole bucket (the key bucket, for the offline hash) costs a syscall
//! per megabyte, not two per page; a lookup reads only the pages on the
//! way to its key, so the size of the file (gigabytes of keys) costs
//! nothing there. Every offset and length read from
//! the file is checked against the page or file before use, visits are
//! bounded by the page count, and depth by a constant: garbage gives an
//! error, never a panic or a loop.

use std::cell::RefCell;
use std::fs::File;
use std::hash::Hasher;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use super::OnDiskError;

const MAGIC: u32 = 0xED0C_DAED;
const VERSION: u32 = 2;
const PAGE_HEADER: usize = 16;
const ELEMENT: usize = 16;
const BUCKET_HEADER: usize = 16;
/// bolt's meta: magic, version, page size, flags, root bucket (16),
/// freelist, pgid, txid; then the checksum of those 56 bytes.
const META_CHECKSUMMED: usize = 56;

const BRANCH_PAGE: u16 = 0x01;
const LEAF_PAGE: u16 = 0x02;
const META_PAGE: u16 = 0x04;
const BUCKET_LEAF: u32 = 0x01;

/// bolt reads the first 4 KiB to find the page size; the second meta
/// page is looked for at the page size the first one names, else here.
const DEFAULT_PAGE_SIZE: u64 = 4096;
/// No B+tree of a real database is this deep.
const MAX_DEPTH: usize = 64;
/// A page (with its overflow) larger than this is not one of the small
/// buckets read here.
const MAX_PAGE_BYTES: u64 = 64 << 20;
/// How much of the file one read brings in (pages are 4 KiB).
const WINDOW_BYTES: u64 = 1 << 20;
/// How many windows are kept (see [`Windows`]).
const WINDOWS: usize = 4;

/// An open database, at its newest valid meta page.
#[derive(Debug)]
pub struct Db {
    file: File,
    path: PathBuf,
    len: u64,
    page_size: u64,
    /// The high-water mark: no valid page id reaches it.
    pages: u64,
    root: u64,
    /// The meta page's transaction id: bolt counts every commit.
    txid: u64,
    /// The parts of the file read last.
    windows: RefCell<Windows>,
}

/// A few windows on the file: a bucket's leaves, in key order, come from
/// a few runs of pages that bolt laid out in order (the key bucket of a
/// 200,000-key database: 4 windows of 1 MiB read the file about once; 1
/// window read it 6 times over).
#[derive(Debug, Default)]
struct Windows {
    slots: Vec<Window>,
    /// Counts reads, to find the least recently used window.
    clock: u64,
}

/// Bytes of the file from `start` on, last used at `used`.
#[derive(Debug, Default)]
struct Window {
    start: u64,
    bytes: Vec<u8>,
    used: u64,
}

/// Where a database was read from: its meta page's page size, page
/// count, root bucket and transaction id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pinned {
    page_size: u64,
    pages: u64,
    root: u64,
    /// bolt's commit count at that meta page.
    pub txid: u64,
}

/// A bucket: a tree of pages, or a leaf page stored inline in its
/// parent's value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Bucket {
    /// Root page id.
    Pages(u64),
    /// The inline leaf page's bytes.
    Inline(Vec<u8>),
}

/// One page's bytes.
struct Page {
    bytes: Vec<u8>,
    flags: u16,
    count: usize,
}

impl Page {
    fn parse(bytes: Vec<u8>) -> Option<Page> {
        let header = bytes.get(..PAGE_HEADER)?;
        let flags = u16::from_le_bytes([header[8], header[9]]);
        let count = usize::from(u16::from_le_bytes([header[10], header[11]]));
        let needed = PAGE_HEADER.checked_add(count.checked_mul(ELEMENT)?)?;
        (needed <= bytes.len()).then_some(Page {
            bytes,
            flags,
            count,
        })
    }

    fn u32_at(&self, at: usize) -> u32 {
        let mut b = [0u8; 4];
        b.copy_from_slice(&self.bytes[at..at + 4]);
        u32::from_le_bytes(b)
    }

    /// Element `i`'s offset (checked in `parse` to lie in the page).
    fn element(&self, i: usize) -> usize {
        PAGE_HEADER + i * ELEMENT
    }

    /// A slice at `element + pos`, `len` long, if inside the page.
    fn slice(&self, element: usize, pos: u32, len: u64) -> Option<&[u8]> {
        let start = element.checked_add(usize::try_from(pos).ok()?)?;
        let end = start.checked_add(usize::try_from(len).ok()?)?;
        self.bytes.get(start..end)
    }

    /// A branch element's key and child page.
    fn branch(&self, i: usize) -> Option<(&[u8], u64)> {
        let e = self.element(i);
        let pos = self.u32_at(e);
        let ksize = self.u32_at(e + 4);
        let mut pgid = [0u8; 8];
        pgid.copy_from_slice(&self.bytes[e + 8..e + 16]);
        Some((
            self.slice(e, pos, u64::from(ksize))?,
            u64::from_le_bytes(pgid),
        ))
    }

    /// A leaf element's flags, key and value.
    fn leaf(&self, i: usize) -> Option<(u32, &[u8], &[u8])> {
        let e = self.element(i);
        let flags = self.u32_at(e);
        let pos = self.u32_at(e + 4);
        let ksize = self.u32_at(e + 8);
        let vsize = self.u32_at(e + 12);
        let both = self.slice(e, pos, u64::from(ksize) + u64::from(vsize))?;
        let (key, value) = both.split_at(ksize as usize);
        Some((flags, key, value))
    }
}

/// The fields of a meta page that are used.
struct Meta {
    page_size: u64,
    root: u64,
    pages: u64,
    txid: u64,
}

/// Parses and validates the meta in the page at `bytes`.
fn parse_meta(bytes: &[u8]) -> Result<Meta, String> {
    let meta = bytes
        .get(PAGE_HEADER..PAGE_HEADER + META_CHECKSUMMED + 8)
        .ok_or("the file ends inside a meta page")?;
    let flags = u16::from_le_bytes([bytes[8], bytes[9]]);
    let u32_at =
        |at: usize| u32::from_le_bytes([meta[at], meta[at + 1], meta[at + 2], meta[at + 3]]);
    let u64_at = |at: usize| {
        let mut b = [0u8; 8];
        b.copy_from_slice(&meta[at..at + 8]);
        u64::from_le_bytes(b)
    };
    if u32_at(0) != MAGIC {
        return Err(format!("no bolt magic (found {:#x})", u32_at(0)));
    }
    if u32_at(4) != VERSION {
        return Err(format!("bolt format version {}, not 2", u32_at(4)));
    }
    if flags & META_PAGE == 0 {
        return Err(format!("page flags {flags:#x} are not a meta page's"));
    }
    let checksum = u64_at(META_CHECKSUMMED);
    let mut fnv = fnv::FnvHasher::default();
    fnv.write(&meta[..META_CHECKSUMMED]);
    // bolt accepts a zero checksum (files from before it had one).
    if checksum != 0 && checksum != fnv.finish() {
        return Err("meta checksum mismatch".to_string());
    }
    let page_size = u64::from(u32_at(8));
    if !(512..=(1 << 20)).contains(&page_size) || !page_size.is_power_of_two() {
        return Err(format!("implausible page size {page_size}"));
    }
    let root = u64_at(16);
    let pages = u64_at(40);
    if root < 2 || root >= pages {
        return Err(format!("root page {root} outside pages 2..{pages}"));
    }
    Ok(Meta {
        page_size,
        root,
        pages,
        txid: u64_at(48),
    })
}

impl Db {
    /// Opens `path` read-only and picks its meta page.
    pub fn open(path: &Path) -> Result<Db, OnDiskError> {
        let io = |source| OnDiskError::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = File::open(path).map_err(io)?;
        let len = file.metadata().map_err(io)?.len();
        let damaged = |what: String| OnDiskError::BoltDamaged {
            path: path.to_path_buf(),
            what,
        };
        let read_at = |offset: u64, size: u64| -> Result<Vec<u8>, OnDiskError> {
            let size = size.min(len.saturating_sub(offset));
            let mut buf = vec![0u8; size as usize];
            file.read_exact_at(&mut buf, offset).map_err(io)?;
            Ok(buf)
        };
        if len < 2 * 512 {
            return Err(damaged(format!(
                "{len} bytes is too short for bolt's two meta pages"
            )));
        }
        let first = parse_meta(&read_at(0, DEFAULT_PAGE_SIZE)?);
        let second_at = first.as_ref().map_or(DEFAULT_PAGE_SIZE, |m| m.page_size);
        let second = parse_meta(&read_at(second_at, DEFAULT_PAGE_SIZE)?);
        let meta = match (first, second) {
            (Ok(a), Ok(b)) => {
                if b.txid > a.txid {
                    b
                } else {
                    a
                }
            }
            (Ok(m), Err(_)) | (Err(_), Ok(m)) => m,
            (Err(a), Err(b)) => {
                return Err(damaged(format!(
                    "neither meta page is valid (first: {a}; second: {b})"
                )))
            }
        };
        Ok(Db {
            file,
            path: path.to_path_buf(),
            len,
            page_size: meta.page_size,
            pages: meta.pages,
            root: meta.root,
            txid: meta.txid,
            windows: RefCell::new(Windows::default()),
        })
    }

    /// Opens `path` again as `pinned` was when it was opened: its pages
    /// as that meta page left them, whatever commits came since. Only
    /// pages no later commit freed read the same (a bucket no commit
    /// since has changed): the caller proves that afterwards.
    pub fn reopen(path: &Path, pinned: Pinned) -> Result<Db, OnDiskError> {
        let io = |source| OnDiskError::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = File::open(path).map_err(io)?;
        let len = file.metadata().map_err(io)?.len();
        Ok(Db {
            file,
            path: path.to_path_buf(),
            len,
            page_size: pinned.page_size,
            pages: pinned.pages,
            root: pinned.root,
            txid: pinned.txid,
            windows: RefCell::new(Windows::default()),
        })
    }

    /// The file read.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// What [`Db::reopen`] needs to read the database as now.
    pub fn pinned(&self) -> Pinned {
        Pinned {
            page_size: self.page_size,
            pages: self.pages,
            root: self.root,
            txid: self.txid,
        }
    }

    /// The last key of `bucket` (not a sub-bucket's), if any: the rightmost
    /// path down its tree.
    pub fn last_key(&self, bucket: &Bucket) -> Result<Option<Vec<u8>>, OnDiskError> {
        let mut page = match bucket {
            Bucket::Inline(bytes) => self.inline_page(bytes)?,
            Bucket::Pages(root) => self.read_page(*root)?,
        };
        for _ in 0..MAX_DEPTH {
            if page.flags & LEAF_PAGE != 0 {
                for i in (0..page.count).rev() {
                    let (flags, key, _) = page.leaf(i).ok_or_else(|| {
                        self.damaged(format!("leaf element {i} points outside its page"))
                    })?;
                    if flags & BUCKET_LEAF == 0 {
                        return Ok(Some(key.to_vec()));
                    }
                }
                return Ok(None);
            }
            if page.flags & BRANCH_PAGE == 0 || page.count == 0 {
                return Err(self.damaged(format!(
                    "a page with flags {:#x} and {} elements in a bucket's tree",
                    page.flags, page.count
                )));
            }
            let (_, child) = page
                .branch(page.count - 1)
                .ok_or_else(|| self.damaged("a branch element points outside its page".into()))?;
            page = self.read_page(child)?;
        }
        Err(self.damaged("the page tree is impossibly deep".into()))
    }

    /// `len` bytes at `offset` (both already checked against the file's
    /// length), from one of the windows; the least recently used one moves
    /// to `offset` when none holds them.
    fn read_at(&self, offset: u64, len: u64) -> std::io::Result<Vec<u8>> {
        if len > WINDOW_BYTES {
            let mut bytes = vec![0u8; len as usize];
            self.file.read_exact_at(&mut bytes, offset)?;
            return Ok(bytes);
        }
        let mut windows = self.windows.borrow_mut();
        windows.clock += 1;
        let now = windows.clock;
        let held = windows
            .slots
            .iter()
            .position(|w| offset >= w.start && offset + len <= w.start + w.bytes.len() as u64);
        let slot = match held {
            Some(slot) => slot,
            None => {
                let slot = if windows.slots.len() < WINDOWS {
                    windows.slots.push(Window::default());
                    windows.slots.len() - 1
                } else {
                    (0..windows.slots.len())
                        .min_by_key(|i| windows.slots[*i].used)
                        .unwrap_or(0)
                };
                let window = &mut windows.slots[slot];
                let size = WINDOW_BYTES.min(self.len.saturating_sub(offset)).max(len);
                window.bytes.resize(size as usize, 0);
                window.start = offset;
                if let Err(err) = self.file.read_exact_at(&mut window.bytes, offset) {
                    window.bytes.clear();
                    return Err(err);
                }
                slot
            }
        };
        let window = &mut windows.slots[slot];
        window.used = now;
        let from = (offset - window.start) as usize;
        Ok(window.bytes[from..from + len as usize].to_vec())
    }

    pub(super) fn damaged(&self, what: String) -> OnDiskError {
        OnDiskError::BoltDamaged {
            path: self.path.clone(),
            what,
        }
    }

    fn read_page(&self, id: u64) -> Result<Page, OnDiskError> {
        if id < 2 || id >= self.pages {
            return Err(self.damaged(format!(
                "a reference to page {id}, outside 2..{}",
                self.pages
            )));
        }
        // `pages` comes from the file: the arithmetic on ids is checked.
        let offset = id
            .checked_mul(self.page_size)
            .filter(|offset| *offset < self.len)
            .ok_or_else(|| self.damaged(format!("page {id} lies past the end of the file")))?;
        let header = self
            .read_at(offset, PAGE_HEADER as u64)
            .map_err(|err| self.damaged(format!("page {id} cannot be read: {err}")))?;
        let stored = u64::from_le_bytes(header[..8].try_into().unwrap_or_default());
        if stored != id {
            return Err(self.damaged(format!("page {id} says it is page {stored}")));
        }
        let overflow = u64::from(u32::from_le_bytes(
            header[12..16].try_into().unwrap_or_default(),
        ));
        let size = (overflow + 1) * self.page_size;
        if id.saturating_add(overflow) >= self.pages
            || offset.saturating_add(size) > self.len
            || size > MAX_PAGE_BYTES
        {
            return Err(self.damaged(format!(
                "page {id} with {overflow} overflow pages runs past the database's end"
            )));
        }
        let bytes = self
            .read_at(offset, size)
            .map_err(|err| self.damaged(format!("page {id} cannot be read: {err}")))?;
        Page::parse(bytes)
            .ok_or_else(|| self.damaged(format!("page {id} lists more elements than it holds")))
    }

    /// The top-level bucket `name`, if it exists.
    pub fn bucket(&self, name: &[u8]) -> Result<Option<Bucket>, OnDiskError> {
        self.nested(&Bucket::Pages(self.root), name)
    }

    /// The sub-bucket `name` of `parent`, if it exists.
    pub fn nested(&self, parent: &Bucket, name: &[u8]) -> Result<Option<Bucket>, OnDiskError> {
        let Some((flags, value)) = self.find(parent, name)? else {
            return Ok(None);
        };
        if flags & BUCKET_LEAF == 0 {
            return Ok(None);
        }
        let header = value.get(..BUCKET_HEADER).ok_or_else(|| {
            self.damaged(format!(
                "bucket {:?} has a short header",
                String::from_utf8_lossy(name)
            ))
        })?;
        let root = u64::from_le_bytes(header[..8].try_into().unwrap_or_default());
        if root == 0 {
            Ok(Some(Bucket::Inline(value[BUCKET_HEADER..].to_vec())))
        } else {
            Ok(Some(Bucket::Pages(root)))
        }
    }

    /// The value of `key` in `bucket` (not a sub-bucket), if present.
    pub fn get(&self, bucket: &Bucket, key: &[u8]) -> Result<Option<Vec<u8>>, OnDiskError> {
        Ok(self
            .find(bucket, key)?
            .filter(|(flags, _)| flags & BUCKET_LEAF == 0)
            .map(|(_, value)| value))
    }

    /// Every key/value pair of `bucket` (sub-buckets left out), in key
    /// order. Meant for the small buckets; reads every page of the tree.
    pub fn for_each(
        &self,
        bucket: &Bucket,
        mut visit: impl FnMut(&[u8], &[u8]) -> Result<(), OnDiskError>,
    ) -> Result<(), OnDiskError> {
        let mut budget = self.pages;
        match bucket {
            Bucket::Inline(bytes) => {
                let page = self.inline_page(bytes)?;
                self.walk_leaf(&page, &mut visit)
            }
            Bucket::Pages(root) => self.walk(*root, 0, &mut budget, &mut visit),
        }
    }

    fn inline_page(&self, bytes: &[u8]) -> Result<Page, OnDiskError> {
        let page = Page::parse(bytes.to_vec()).ok_or_else(|| {
            self.damaged("an inline bucket lists more elements than it holds".into())
        })?;
        if page.flags & LEAF_PAGE == 0 {
            return Err(self.damaged(format!(
                "an inline bucket's page has flags {:#x}",
                page.flags
            )));
        }
        Ok(page)
    }

    fn walk(
        &self,
        id: u64,
        depth: usize,
        budget: &mut u64,
        visit: &mut impl FnMut(&[u8], &[u8]) -> Result<(), OnDiskError>,
    ) -> Result<(), OnDiskError> {
        if depth > MAX_DEPTH || *budget == 0 {
            return Err(self.damaged("the page tree loops or is impossibly deep".into()));
        }
        *budget -= 1;
        let page = self.read_page(id)?;
        if page.flags & LEAF_PAGE != 0 {
            return self.walk_leaf(&page, visit);
        }
        if page.flags & BRANCH_PAGE == 0 {
            return Err(self.damaged(format!(
                "page {id} has flags {:#x}, not a tree page",
                page.flags
            )));
        }
        for i in 0..page.count {
            let (_, child) = page
                .branch(i)
                .ok_or_else(|| self.damaged(format!("page {id} element {i} points outside it")))?;
            self.walk(child, depth + 1, budget, visit)?;
        }
        Ok(())
    }

    fn walk_leaf(
        &self,
        page: &Page,
        visit: &mut impl FnMut(&[u8], &[u8]) -> Result<(), OnDiskError>,
    ) -> Result<(), OnDiskError> {
        for i in 0..page.count {
            let (flags, key, value) = page
                .leaf(i)
                .ok_or_else(|| self.damaged(format!("leaf element {i} points outside its page")))?;
            if flags & BUCKET_LEAF == 0 {
                visit(key, value)?;
            }
        }
        Ok(())
    }

    /// Finds `key` in `bucket`: its leaf flags and value.
    fn find(&self, bucket: &Bucket, key: &[u8]) -> Result<Option<(u32, Vec<u8>)>, OnDiskError> {
        let mut page = match bucket {
            Bucket::Inline(bytes) => self.inline_page(bytes)?,
            Bucket::Pages(root) => self.read_page(*root)?,
        };
        for _ in 0..MAX_DEPTH {
            if page.flags & LEAF_PAGE != 0 {
                for i in 0..page.count {
                    let (flags, k, v) = page.leaf(i).ok_or_else(|| {
                        self.damaged(format!("leaf element {i} points outside its page"))
                    })?;
                    if k == key {
                        return Ok(Some((flags, v.to_vec())));
                    }
                }
                return Ok(None);
            }
            if page.flags & BRANCH_PAGE == 0 || page.count == 0 {
                return Err(self.damaged(format!(
                    "a tree page has flags {:#x} and {} elements",
                    page.flags, page.count
                )));
            }
            // bolt's search: the last element whose key is <= the key.
            let mut child = None;
            for i in 0..page.count {
                let (k, id) = page.branch(i).ok_or_else(|| {
                    self.damaged(format!("branch element {i} points outside its page"))
                })?;
                if i == 0 || k <= key {
                    child = Some(id);
                }
                if k > key {
                    break;
                }
            }
            let Some(child) = child else {
                return Ok(None);
            };
            page = self.read_page(child)?;
        }
        Err(self.damaged("the page tree loops or is impossibly deep".into()))
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    const PAGE: usize = 4096;

    /// Writes one leaf page's elements for `(flags, key, value)` into a
    /// page buffer of `size` bytes with id `id`.
    pub fn leaf_page(id: u64, items: &[(u32, &[u8], &[u8])], size: usize) -> Vec<u8> {
        let needed = PAGE_HEADER
            + items.len() * ELEMENT
            + items
                .iter()
                .map(|(_, k, v)| k.len() + v.len())
                .sum::<usize>();
        let mut page = vec![0u8; size.max(needed)];
        page[..8].copy_from_slice(&id.to_le_bytes());
        page[8..10].copy_from_slice(&LEAF_PAGE.to_le_bytes());
        page[10..12].copy_from_slice(&(items.len() as u16).to_le_bytes());
        let mut data = PAGE_HEADER + items.len() * ELEMENT;
        for (i, (flags, key, value)) in items.iter().enumerate() {
            let e = PAGE_HEADER + i * ELEMENT;
            page[e..e + 4].copy_from_slice(&flags.to_le_bytes());
            page[e + 4..e + 8].copy_from_slice(&((data - e) as u32).to_le_bytes());
            page[e + 8..e + 12].copy_from_slice(&(key.len() as u32).to_le_bytes());
            page[e + 12..e + 16].copy_from_slice(&(value.len() as u32).to_le_bytes());
            page[data..data + key.len()].copy_from_slice(key);
            data += key.len();
            page[data..data + value.len()].copy_from_slice(value);
            data += value.len();
        }
        page
    }

    fn branch_page(id: u64, items: &[(&[u8], u64)]) -> Vec<u8> {
        let mut page = vec![0u8; PAGE];
        page[..8].copy_from_slice(&id.to_le_bytes());
        page[8..10].copy_from_slice(&BRANCH_PAGE.to_le_bytes());
        page[10..12].copy_from_slice(&(items.len() as u16).to_le_bytes());
        let mut data = PAGE_HEADER + items.len() * ELEMENT;
        for (i, (key, child)) in items.iter().enumerate() {
            let e = PAGE_HEADER + i * ELEMENT;
            page[e..e + 4].copy_from_slice(&((data - e) as u32).to_le_bytes());
            page[e + 4..e + 8].copy_from_slice(&(key.len() as u32).to_le_bytes());
            page[e + 8..e + 16].copy_from_slice(&child.to_le_bytes());
            page[data..data + key.len()].copy_from_slice(key);
            data += key.len();
        }
        page
    }

    fn meta_page(id: u64, root: u64, pages: u64, txid: u64) -> Vec<u8> {
        let mut page = vec![0u8; PAGE];
        page[..8].copy_from_slice(&id.to_le_bytes());
        page[8..10].copy_from_slice(&META_PAGE.to_le_bytes());
        let m = PAGE_HEADER;
        page[m..m + 4].copy_from_slice(&MAGIC.to_le_bytes());
        page[m + 4..m + 8].copy_from_slice(&VERSION.to_le_bytes());
        page[m + 8..m + 12].copy_from_slice(&(PAGE as u32).to_le_bytes());
        page[m + 16..m + 24].copy_from_slice(&root.to_le_bytes());
        page[m + 40..m + 48].copy_from_slice(&pages.to_le_bytes());
        page[m + 48..m + 56].copy_from_slice(&txid.to_le_bytes());
        let mut fnv = fnv::FnvHasher::default();
        fnv.write(&page[m..m + META_CHECKSUMMED]);
        page[m + 56..m + 64].copy_from_slice(&fnv.finish().to_le_bytes());
        page
    }

    fn inline_bucket(items: &[(u32, &[u8], &[u8])]) -> Vec<u8> {
        let mut value = vec![0u8; BUCKET_HEADER];
        value.extend(leaf_page(0, items, 0));
        value
    }

    /// A database whose root (page 4, a branch) splits into two leaves:
    /// page 2 holds bucket "auth" (inline), page 3 bucket "lease" (page 5)
    /// and "meta" (inline).
    pub fn small_db() -> Vec<u8> {
        let auth = inline_bucket(&[(0, b"authEnabled", &[1])]);
        let meta = inline_bucket(&[(0, b"consistent_index", &7u64.to_be_bytes())]);
        let mut lease_header = vec![0u8; BUCKET_HEADER];
        lease_header[..8].copy_from_slice(&5u64.to_le_bytes());
        let mut file = meta_page(0, 4, 6, 10);
        file.extend(meta_page(1, 4, 6, 11));
        file.extend(leaf_page(2, &[(BUCKET_LEAF, b"auth", &auth)], PAGE));
        file.extend(leaf_page(
            3,
            &[
                (BUCKET_LEAF, b"lease", &lease_header),
                (BUCKET_LEAF, b"meta", &meta),
            ],
            PAGE,
        ));
        file.extend(branch_page(4, &[(b"auth", 2), (b"lease", 3)]));
        // `leasepb.Lease{ID, TTL}`: 1 → 60 s, 2 → 120 s.
        file.extend(leaf_page(
            5,
            &[
                (0, &1i64.to_be_bytes(), &[0x08, 1, 0x10, 60]),
                (0, &2i64.to_be_bytes(), &[0x08, 2, 0x10, 120]),
            ],
            PAGE,
        ));
        file
    }

    fn open_bytes(bytes: &[u8]) -> (tempfile::TempDir, Result<Db, OnDiskError>) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db");
        std::fs::write(&path, bytes).unwrap();
        let db = Db::open(&path);
        (dir, db)
    }

    #[test]
    fn finds_keys_through_branches_inline_buckets_and_pages() {
        let (_dir, db) = open_bytes(&small_db());
        let db = db.unwrap();
        let auth = db.bucket(b"auth").unwrap().unwrap();
        assert_eq!(db.get(&auth, b"authEnabled").unwrap(), Some(vec![1]));
        assert_eq!(db.get(&auth, b"nope").unwrap(), None);
        let meta = db.bucket(b"meta").unwrap().unwrap();
        assert_eq!(
            db.get(&meta, b"consistent_index").unwrap(),
            Some(7u64.to_be_bytes().to_vec())
        );
        let lease = db.bucket(b"lease").unwrap().unwrap();
        let mut seen = Vec::new();
        db.for_each(&lease, |k, v| {
            seen.push((k.to_vec(), v.to_vec()));
            Ok(())
        })
        .unwrap();
        assert_eq!(seen.len(), 2);
        assert!(db.bucket(b"key").unwrap().is_none());
        assert!(db.bucket(b"aaa").unwrap().is_none());
    }

    #[test]
    fn a_bad_newer_meta_falls_back_to_the_older() {
        let mut file = small_db();
        file[PAGE + PAGE_HEADER + 20] ^= 1; // meta 1's root: checksum fails
        let (_dir, db) = open_bytes(&file);
        let db = db.unwrap();
        assert!(db.bucket(b"lease").unwrap().is_some());
        file[PAGE_HEADER] ^= 1; // meta 0's magic
        let (_dir, db) = open_bytes(&file);
        assert!(matches!(db, Err(OnDiskError::BoltDamaged { .. })));
    }

    #[test]
    fn a_page_that_points_at_itself_is_an_error_not_a_loop() {
        let mut file = small_db();
        let looped = branch_page(4, &[(b"auth", 4), (b"lease", 4)]);
        file[4 * PAGE..5 * PAGE].copy_from_slice(&looped);
        let (_dir, db) = open_bytes(&file);
        let db = db.unwrap();
        assert!(db.bucket(b"lease").is_err());
    }

    #[test]
    fn huge_page_ids_are_errors_not_overflows() {
        let mut file = small_db();
        file[..PAGE].copy_from_slice(&meta_page(0, 4, u64::MAX, 10));
        file[PAGE..2 * PAGE].copy_from_slice(&meta_page(1, 4, u64::MAX, 11));
        let huge = branch_page(
            4,
            &[(b"auth", u64::MAX - 1), (b"lease", u64::MAX / 4096 + 1)],
        );
        file[4 * PAGE..5 * PAGE].copy_from_slice(&huge);
        let (_dir, db) = open_bytes(&file);
        let db = db.unwrap();
        assert!(db.bucket(b"auth").is_err());
        assert!(db.bucket(b"lease").is_err());
    }

    #[test]
    fn every_truncation_and_garbage_is_an_error_or_an_answer() {
        let file = small_db();
        for cut in (0..file.len()).step_by(61) {
            let (_dir, db) = open_bytes(&file[..cut]);
            if let Ok(db) = db {
                for name in [&b"auth"[..], b"lease", b"meta", b"members"] {
                    if let Ok(Some(bucket)) = db.bucket(name) {
                        let _ = db.for_each(&bucket, |_, _| Ok(()));
                    }
                }
            }
        }
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        for round in 0..300 {
            let mut bad = file.clone();
            for _ in 0..(1 + round % 8) {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                // Spare the metas half the time, so the trees get garbage.
                let start = if round % 2 == 0 { 2 * PAGE } else { 0 };
                let at = start + (seed as usize) % (file.len() - start);
                bad[at] = (seed >> 32) as u8;
            }
            let (_dir, db) = open_bytes(&bad);
            if let Ok(db) = db {
                for name in [&b"auth"[..], b"lease", b"meta"] {
                    if let Ok(Some(bucket)) = db.bucket(name) {
                        let _ = db.get(&bucket, b"authEnabled");
                        let _ = db.for_each(&bucket, |_, _| Ok(()));
                    }
                }
            }
        }
    }
}
