"""Budgets in Persian, Arabic and Russian (issue 31): a byte-pair tokenizer spends more
tokens per character on them than on English, so a worst case sized on English text can be
low. Measured here with examforge/tokens.py: a realistic Persian reply (five questions as a
model writes them) and the mock's corpora on o200k_base and cl100k_base; each language's
reply_tokens factor (examforge.languages) covers its measured ratio, and a chapter's calls
reserve LLM_MAX_TOKENS_PER_QUESTION times it (the English allowance was below the mock's
Persian questions on cl100k_base). Before an exam has history, it is sized from the model's
calls of exams in its own language only."""

from __future__ import annotations

import json

import pytest

from examforge.settings import Settings
from examforge.tokens import count_text, encoding_name

# A realistic Persian reply: what a model writes for a chapter on storage.
PERSIAN = [
    ("کدام کلاس ذخیره‌سازی Amazon S3 برای داده‌هایی که سالی یک‌بار خوانده می‌شوند و باید ۷ سال "
     "نگهداری شوند، کم‌هزینه‌ترین گزینه است؟",
     ["S3 Glacier Deep Archive", "S3 Standard", "S3 Intelligent-Tiering", "S3 One Zone-IA"],
     "Glacier Deep Archive ارزان‌ترین کلاس برای داده‌های بایگانی با دسترسی بسیار کم است؛ زمان "
     "بازیابی آن تا ۱۲ ساعت است که برای داده‌ای که سالی یک‌بار خوانده می‌شود پذیرفتنی است."),
    ("یک تیم می‌خواهد نسخه‌های قبلی اشیای یک باکت را پس از حذف یا بازنویسی تصادفی بازیابی کند. "
     "کدام قابلیت را باید فعال کند؟",
     ["نسخه‌بندی (Versioning)", "رمزنگاری سمت سرور", "تکثیر بین‌منطقه‌ای", "قفل شیء در حالت "
      "انطباق"],
     "با نسخه‌بندی، هر بازنویسی یا حذف نسخهٔ تازه‌ای می‌سازد و نسخه‌های قبلی باقی می‌مانند؛ "
     "رمزنگاری و تکثیر به‌تنهایی نسخهٔ قبلی را نگه نمی‌دارند."),
    ("کدام نوع ذخیره‌سازی برای دیسک ریشهٔ یک نمونهٔ EC2 که باید پس از توقف نمونه باقی بماند "
     "مناسب است؟",
     ["Amazon EBS", "Instance Store", "Amazon S3", "Amazon EFS"],
     "حجم‌های EBS مستقل از چرخهٔ عمر نمونه باقی می‌مانند؛ دادهٔ Instance Store با توقف نمونه "
     "از بین می‌رود."),
    ("برای اشتراک یک سامانهٔ فایل میان ده‌ها نمونهٔ Linux در چند ناحیهٔ دسترس‌پذیری از کدام "
     "سرویس استفاده می‌شود؟",
     ["Amazon EFS", "Amazon EBS Multi-Attach", "Amazon S3 Glacier", "AWS Backup"],
     "EFS یک سامانهٔ فایل NFS مدیریت‌شده است که هم‌زمان از چند ناحیه قابل اتصال است؛ EBS "
     "Multi-Attach به یک ناحیه محدود است."),
    ("اگر هدف نقطهٔ بازیابی (RPO) پانزده دقیقه باشد، پشتیبان‌گیری روزانه چه مشکلی دارد؟",
     ["تا ۲۴ ساعت داده از دست می‌رود", "هزینه را دو برابر می‌کند", "RTO را کاهش می‌دهد",
      "مشکلی ندارد"],
     "RPO بیشینهٔ داده‌ای است که می‌توان از دست داد؛ با پشتیبان روزانه این مقدار تا یک روز "
     "است که از ۱۵ دقیقه بسیار بیشتر است."),
]
ENGLISH = [
    ("Which Amazon S3 storage class is the cheapest for data read once a year that must be "
     "kept for 7 years?",
     ["S3 Glacier Deep Archive", "S3 Standard", "S3 Intelligent-Tiering", "S3 One Zone-IA"],
     "Glacier Deep Archive is the cheapest class for rarely accessed archives; its retrieval "
     "time of up to 12 hours is acceptable for data read once a year."),
] * 5


def _reply(questions: list[tuple[str, list[str], str]]) -> str:
    return json.dumps({"questions": [
        {"question": q, "choices": c, "answer_index": 0, "explanation": e}
        for q, c, e in questions]}, ensure_ascii=False)


@pytest.mark.parametrize("model", ["gpt-4o-mini", "gpt-4"])  # o200k_base and cl100k_base
def test_a_persian_reply_fits_the_fixed_allowance_per_question(model: str) -> None:
    allowance = Settings.model_fields["llm_max_tokens_per_question"].default
    persian, english = _reply(PERSIAN), _reply(ENGLISH)
    fa_tokens, en_tokens = count_text(persian, model), count_text(english, model)
    fa_per_char, en_per_char = fa_tokens / len(persian), en_tokens / len(english)
    print(f"\n{encoding_name(model)}: Persian {fa_tokens / 5:.0f} tokens a question "
          f"({fa_per_char:.2f} a character), English {en_tokens / 5:.0f} "
          f"({en_per_char:.2f}); the fixed allowance {allowance}")
    assert fa_per_char > en_per_char  # the premise: more tokens per character
    # The bound: a Persian question's reply takes well under the allowance a call reserves
    # before history exists (at most 3/4 of it, room for a verbose model).
    assert fa_tokens / 5 <= 0.75 * allowance


@pytest.mark.parametrize("model", ["gpt-4o-mini", "gpt-4"])
@pytest.mark.parametrize("text", [
    "ما هي فئة تخزين Amazon S3 الأقل تكلفة للبيانات التي تُقرأ مرة واحدة في السنة ويجب الاحتفاظ "
    "بها لمدة ٧ سنوات؟ S3 Glacier Deep Archive هي الأرخص للأرشيف النادر الوصول.",
    "Какой класс хранения Amazon S3 самый дешёвый для данных, которые читают раз в год и должны "
    "храниться 7 лет? S3 Glacier Deep Archive дешевле всего для редко читаемых архивов.",
])
def test_arabic_and_russian_cost_more_tokens_per_character_and_stay_bounded(
        model: str, text: str) -> None:
    english = ENGLISH[0][0] + " " + ENGLISH[0][2]
    tokens = count_text(text, model)
    assert tokens / len(text) > count_text(english, model) / len(english)
    # This text (a question and an explanation) is about two thirds of a question's reply,
    # choices and JSON added: counted as three times it, still inside the allowance. (On
    # cl100k_base Arabic comes nearest: 3 x 105 of 400.)
    print(f"\n{encoding_name(model)}: {tokens} tokens, {tokens / len(text):.2f} a character")
    assert 3 * tokens <= Settings.model_fields["llm_max_tokens_per_question"].default


def test_the_model_s_history_sizes_an_exam_only_from_exams_in_its_language(tmp_path) -> None:
    """Before an exam has history of its own, its max_tokens is sized from the model's calls
    (examforge.sizing): those of exams in its own language only, since an English history
    would size a Persian exam's first calls too small and cut their replies."""
    from sqlalchemy import insert

    from examforge.syllabus import Syllabus
    from storage import open_store
    from storage.base import K

    store = open_store(f"sqlite:///{tmp_path / 'ef.db'}")
    for slug, language in (("en-old", "en"), ("en-new", "en"), ("fa-new", "fa")):
        store.sync_exam(slug, Syllabus.model_validate({
            "title": slug, "language": language,
            "chapters": [{"id": "a", "title": "A", "questions": 5}]}))
    with store.engine.begin() as conn:
        conn.execute(insert(K), [{
            "exam": "en-old", "chapter_id": "a", "slice_no": 0, "attempt": 1,
            "first_number": 1, "requested": 5, "worker": "w", "outcome": "used",
            "completion_tokens": 250, "prompt_tokens": 100, "questions_stored": 5,
            "model": "m", "max_tokens": 2100, "started_at": 0.0, "finished_at": 1.0}] * 12)
    try:
        assert store.completion_history("en-new", "m", 200, 10) == ([50.0] * 12, "model")
        assert store.completion_history("fa-new", "m", 200, 10) == ([], "exam")
    finally:
        store.engine.dispose()


def test_each_language_s_allowance_covers_its_replies() -> None:
    """The fixed allowance per question scales by the language's reply_tokens: measured on
    cl100k_base, the costlier tokenizer, a question of the mock's corpus (wordier than the
    realistic reply above) takes up to 3.1 times an English one, above the English
    allowance in Persian; each language's factor covers its measured ratio."""
    from mockllm import corpora, questions

    from examforge.languages import language
    from examforge.sizing import fixed_allowance

    settings = Settings(llm_api_key="k")

    def per_question(items: list[dict[str, object]]) -> float:
        return count_text(json.dumps({"questions": items}, ensure_ascii=False, indent=2),
                          "gpt-4") / len(items)

    english = per_question([questions.make_question("ex/a", "Storage", s) for s in range(1, 21)])
    for tag in sorted(corpora.CORPORA):
        tokens = per_question([corpora.make_question(tag, "ex/a", "T", s) for s in range(1, 21)])
        print(f"\n{tag}: {tokens:.0f} tokens a question ({tokens / english:.2f}x English's "
              f"{english:.0f}); allowance {fixed_allowance(settings, tag)}")
        assert tokens / english <= language(tag).reply_tokens
        assert tokens <= 0.5 * fixed_allowance(settings, tag)
    assert fixed_allowance(settings, "fa") > 400 == fixed_allowance(settings, "en")


def test_a_chapter_is_asked_with_its_language_s_allowance(make_settings) -> None:
    """A Persian chapter's calls reserve its language's allowance (a reply cut at the English
    one would be asked again and again), an English chapter of the same exam English's; once
    history exists, the sized allowance is capped at the language's, not at English's."""
    from fakellm import FakeLLM
    from helpers import write_syllabus

    from examforge.llm import LLMClient
    from examforge.settings import MAX_TOKENS_OVERHEAD
    from examforge.sizing import Allowance, fixed_allowance
    from examforge.syllabus import load_syllabus
    from runner.pipeline import Runtime, process_chapter
    from storage import open_store

    settings = make_settings()
    path = write_syllabus(settings.exams_dir, "ex", {"title": "T", "language": "fa", "chapters": [
        {"id": "a", "title": "فصل", "questions": 5},
        {"id": "b", "title": "B", "questions": 5, "language": "en"}]})
    store = open_store(settings.database_url)
    store.sync_exam("ex", load_syllabus(path, max_questions=1000), slice_questions=5)
    fake = FakeLLM()
    rt = Runtime.build(settings, store, LLMClient(settings, transport=fake.transport()))
    try:
        assert process_chapter(rt, "ex", "a").outcome == "done"
        assert process_chapter(rt, "ex", "b").outcome == "done"
    finally:
        rt.close()
        store.engine.dispose()
    fa, en = fixed_allowance(settings, "fa"), fixed_allowance(settings, "en")
    assert [r["max_tokens"] for r in fake.requests] == [MAX_TOKENS_OVERHEAD + 5 * fa,
                                                        MAX_TOKENS_OVERHEAD + 5 * en]
    sized = Allowance(400, "p95", 585)  # a Persian history: p95 450 x 1.3
    assert (sized.in_language(settings, "fa"), sized.in_language(settings, "en")) == (585, 400)


def test_the_replace_worst_case_counts_a_persian_reply_s_allowance(make_settings) -> None:
    """The worst case VERIFY=replace states for a slice (examforge.estimate), for a Persian
    chapter: its generation calls at the Persian allowance (3.5 times English's per question,
    as the calls are sent), so that the stated bound holds for the calls a Persian chapter
    makes; the solves are the same."""
    from examforge.estimate import replace_worst_case
    from examforge.sizing import fixed_allowance

    settings = make_settings(llm_price_prompt_per_mtok=1.0, llm_price_completion_per_mtok=4.0)
    english = replace_worst_case(settings, 20, 1000, 800)
    persian = replace_worst_case(settings, 20, 1000, 800, language="fa")
    assert fixed_allowance(settings, "fa") > fixed_allowance(settings, None)
    assert persian.rounds == english.rounds and persian.solve_usd == english.solve_usd
    q = english.questions // english.rounds
    extra = q * (fixed_allowance(settings, "fa") - fixed_allowance(settings, None))
    assert persian.generation_usd - english.generation_usd == pytest.approx(
        english.rounds * extra * 4.0 / 1e6)
