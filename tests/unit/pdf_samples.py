"""PDFs written for tests: text pages by hand (a minimal PDF 1.4 with Helvetica), blank
("scanned": no extractable text), encrypted and damaged ones through pypdf."""

from __future__ import annotations

import io


def _escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)")


def _pdf(objects: list[bytes]) -> bytes:
    out = io.BytesIO()
    out.write(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(objects, 1):
        offsets.append(out.tell())
        out.write(f"{number} 0 obj\n".encode() + body + b"\nendobj\n")
    xref = out.tell()
    out.write(f"xref\n0 {len(objects) + 1}\n0000000000 65535 f \n".encode())
    for offset in offsets:
        out.write(f"{offset:010d} 00000 n \n".encode())
    out.write(f"trailer\n<< /Size {len(objects) + 1} /Root 1 0 R >>\nstartxref\n{xref}\n%%EOF\n"
              .encode())
    return out.getvalue()


def text_pdf(pages: list[str]) -> bytes:
    """A PDF whose page i shows the lines of pages[i] (ASCII)."""
    objects: list[bytes] = []
    n = len(pages)
    # 1: catalog, 2: pages, 3: font, then (page, content) pairs.
    kids = " ".join(f"{4 + 2 * i} 0 R" for i in range(n))
    objects.append(b"<< /Type /Catalog /Pages 2 0 R >>")
    objects.append(f"<< /Type /Pages /Kids [{kids}] /Count {n} >>".encode())
    objects.append(b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>")
    for i, text in enumerate(pages):
        lines = text.split("\n")
        ops = ["BT", "/F1 11 Tf", "14 TL", "50 780 Td"]
        for line in lines:
            ops.append(f"({_escape(line)}) Tj T*")
        ops.append("ET")
        stream = "\n".join(ops).encode("latin-1")
        objects.append(f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 842] "
                       f"/Resources << /Font << /F1 3 0 R >> >> /Contents {5 + 2 * i} 0 R >>"
                       .encode())
        objects.append(b"<< /Length %d >>\nstream\n" % len(stream) + stream + b"\nendstream")
    return _pdf(objects)


def blank_pdf(pages: int = 2) -> bytes:
    """Pages with no text at all: what a scan without OCR looks like to an extractor."""
    from pypdf import PdfWriter

    writer = PdfWriter()
    for _ in range(pages):
        writer.add_blank_page(612, 842)
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()


def encrypted_pdf(pages: list[str]) -> bytes:
    from pypdf import PdfReader, PdfWriter

    writer = PdfWriter(clone_from=PdfReader(io.BytesIO(text_pdf(pages))))
    writer.encrypt("secret")
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()


def damaged_pdf() -> bytes:
    return b"%PDF-1.4\n1 0 obj\n<< /Type /Catalog /Pages 9 0 R >>\nendobj\ngarbage" * 3


def operator_bomb(pages: int = 20, operators: int = 300_000) -> bytes:
    """A few kilobytes that cost minutes to extract: `pages` pages sharing one Flate-compressed
    content stream of `operators` text operators (the same short show-text, which compresses to
    almost nothing). Each page parses the whole stream again."""
    import zlib

    stream = b"BT /F1 1 Tf " + b"(a) Tj " * operators + b"ET"
    packed = zlib.compress(stream, 9)
    kids = " ".join(f"{5 + i} 0 R" for i in range(pages))
    objects = [b"<< /Type /Catalog /Pages 2 0 R >>",
               f"<< /Type /Pages /Kids [{kids}] /Count {pages} >>".encode(),
               b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
               b"<< /Length %d /Filter /FlateDecode >>\nstream\n" % len(packed) + packed
               + b"\nendstream"]
    for _ in range(pages):
        objects.append(b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 842] "
                       b"/Resources << /Font << /F1 3 0 R >> >> /Contents 4 0 R >>")
    return _pdf(objects)
