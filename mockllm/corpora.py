"""Questions in Persian, Arabic and Russian: the mock writes in the language the prompt's
Language line names (issue 31), from the small corpora below.

The scheme is mockllm.questions' own, smaller: a question is a tuple of slots (stem, concept,
scenario, actor, goal) drawn from word banks of P entries each, serial ``s`` of a chapter
mapped through a per-chapter affine bijection to row ``n = a*P + b`` of an orthogonal array
over ``Z_P`` (slots ``a, b, a+b, a+2b, a+3b``), so two questions of one chapter share at most
one of their five word groups. With P = 7 a chapter has 49 pairwise distinct questions
(the demo's chapters have 20); beyond that it cycles with its banks re-drawn and a "(part N)"
suffix in the language, and a few of those are near-duplicates of the first pass, which the
check rejects and the run asks again for (English's corpus, P = 29, has 841).

A paraphrase (``reword``) flips some of the surface forms, as a model repeats itself: the
"which" form against the "what" form, a synonym for the concept, actor, goal or scenario,
the scenario clause moved, and what issue 31 names of these scripts: numbers in the
language's own digits (Persian ۰-۹, Arabic-Indic ٠-٩; Russian "12 000"), and a Persian
question retyped with the Arabic yeh and kaf, an Arabic one with bare alefs. The choices and
the answer stay the same.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any

from mockllm.questions import ANSWER_SLOTS, _rng, answer_index

P = 7

Pair = tuple[str, str]


@dataclass(frozen=True)
class Corpus:
    stems: tuple[Pair, ...]  # ("which" form, "what" form) with {actor} {concept} {title} {goal}
    concepts: tuple[Pair, ...]
    scenarios: tuple[Pair, ...]
    actors: tuple[Pair, ...]
    goals: tuple[Pair, ...]
    good: tuple[str, ...]
    bad: tuple[str, ...]
    explanation: str  # {correct} {concept}
    question_mark: str
    comma: str
    part: str  # {n}
    digits: str  # the language's digits 0-9 ("" for ASCII: numbers are regrouped instead)
    # The letters a writer of the language may type for the corpus's own (retyped forms).
    retype: dict[str, str | int | None]


FA = Corpus(
    stems=(
        ("کدام روش بهترین راه برای {actor} است تا {concept} را در {title} مدیریت کند {goal}",
         "بهترین راه برای {actor} جهت مدیریت {concept} در {title} چیست {goal}"),
        ("کدام گام را {actor} باید نخست برای بهبود {concept} در {title} بردارد {goal}",
         "{actor} برای بهبود {concept} در {title} نخست چه باید بکند {goal}"),
        ("کدام اقدام به {actor} اجازه می‌دهد {concept} را در {title} ایمن کند {goal}",
         "چه اقدامی به {actor} امکان می‌دهد {concept} را در {title} ایمن کند {goal}"),
        ("کدام تصمیم درباره {concept} در {title} را {actor} باید بگیرد {goal}",
         "{actor} درباره {concept} در {title} چه تصمیمی باید بگیرد {goal}"),
        ("کدام نشانه را {actor} باید برای {concept} در {title} زیر نظر بگیرد {goal}",
         "{actor} برای {concept} در {title} به چه نشانه‌ای باید توجه کند {goal}"),
        ("کدام معیار به {actor} کمک می‌کند {concept} را در {title} ارزیابی کند {goal}",
         "با چه معیاری {actor} می‌تواند {concept} را در {title} بسنجد {goal}"),
        ("کدام سازوکار حفاظتی را {actor} باید به {concept} در {title} بیفزاید {goal}",
         "{actor} چه سازوکار حفاظتی باید به {concept} در {title} اضافه کند {goal}"),
    ),
    concepts=(("برنامه‌ریزی ظرفیت", "پیش‌بینی ظرفیت"), ("کنترل دسترسی", "مدیریت مجوزها"),
              ("ثبت رویدادهای ممیزی", "سوابق فعالیت"),
              ("چرخش نسخه‌های پشتیبان", "گردش دوره‌ای پشتیبان‌ها"),
              ("چرخش رمزهای محرمانه", "نوسازی اعتبارنامه‌ها"),
              ("بررسی سلامت سرویس", "پایش زنده بودن سرویس"),
              ("مسیریابی ترافیک", "هدایت درخواست‌ها")),
    scenarios=(
        ("در جریان ممیزی فصلی انطباق", "هنگامی که بازبینی فصلی انطباق در جریان است"),
        ("پس از رسیدن ترافیک به 12000 درخواست در ثانیه",
         "به دنبال جهش ناگهانی به 12000 درخواست در ثانیه"),
        ("پیش از عرضه یک محصول مهم", "در آستانه یک انتشار بزرگ"),
        ("در یک پنجره نگهداری 4 ساعته شبانه", "در یک بازه نگهداری 4 ساعته دیروقت"),
        ("پس از آنکه یک بازبینی امنیتی شکافی را نشان داد",
         "وقتی بررسی امنیتی داخلی یک ضعف پیدا کرد"),
        ("وقتی اهداف تأخیر 7 روز پیاپی برآورده نشده‌اند",
         "پس از 7 روز از دست رفتن اهداف زمان پاسخ"),
        ("هنگام تمرین بازیابی از فاجعه", "در حین تمرین بازگشت از یک قطعی بزرگ")),
    actors=(("یک اپراتور", "یک متصدی سامانه"), ("یک مهندس پلتفرم", "یک مهندس زیرساخت"),
            ("توسعه‌دهنده کشیک", "برنامه‌نویس آنکال"), ("یک بازبین امنیتی", "یک ممیز امنیت"),
            ("مدیر پروژه", "سرپرست تیم"), ("یک معمار راهکار", "یک طراح سامانه"),
            ("یک مهندس داده", "یک مهندس خط لوله داده")),
    goals=(("تا هزینه‌ها قابل پیش‌بینی بمانند", "به‌طوری که هزینه‌ها پیش‌بینی‌پذیر باشند"),
           ("تا خطر از دست رفتن داده کم شود", "به‌گونه‌ای که داده کمتری از دست برود"),
           ("تا زمان بازیابی کوتاه شود", "به‌طوری که بازیابی زمان کمتری ببرد"),
           ("تا غافلگیری در محیط عملیاتی رخ ندهد",
            "به‌طوری که در محیط عملیاتی اتفاق غیرمنتظره‌ای نیفتد"),
           ("تا مسئولیت‌ها روشن شوند", "به‌طوری که همه بدانند مالک هر چیز کیست"),
           ("تا مشکلات زودتر شناسایی شوند", "به‌طوری که مشکلات زودتر دیده شوند"),
           ("تا کار دستی کمتر شود", "به‌طوری که کارهای دستی کاهش یابد")),
    good=("یک مالک مشخص تعیین کنید و پیکربندی را در فواصل ثابت بازبینی کنید",
          "بررسی را خودکار کنید و هنگام انحراف از خط مبنا هشدار دهید",
          "با یک آزمایش کوچک شروع کنید و پیش از گسترش، اثر آن را بسنجید",
          "تغییر را مرحله‌به‌مرحله با طرح بازگشت آزموده‌شده منتشر کنید",
          "دسترسی را به افراد نیازمند محدود کنید و هر استفاده را ثبت کنید",
          "مسیر بازیابی را به‌طور منظم تمرین کنید و زمان آن را اندازه بگیرید"),
    bad=("تا زمانی که کاربران شکایت نکرده‌اند کاری نکنید",
         "تغییر را بدون آزمایش یک‌باره همه‌جا اعمال کنید",
         "به حافظه یک مهندس ارشد تکیه کنید",
         "هشدارهای مرتبط را برای کاهش سروصدا خاموش کنید",
         "به همه دسترسی مدیر بدهید تا کار معطل نشود",
         "اعتبارنامه‌ها را در یک صفحه‌گسترده مشترک نگه دارید"),
    explanation="«{correct}» {concept} را تحت کنترل نگه می‌دارد؛ روش‌های دیگر آن را به شانس "
                "می‌سپارند یا خطر را بیشتر می‌کنند.",
    question_mark="؟", comma="،", part="(بخش {n})", digits="۰۱۲۳۴۵۶۷۸۹",
    retype={"ی": "ي", "ک": "ك"},
)

AR = Corpus(
    stems=(
        ("أي طريقة هي الأفضل لكي يدير {actor} {concept} في {title} {goal}",
         "ما الطريقة الأفضل لكي يدير {actor} {concept} في {title} {goal}"),
        ("أي خطوة يجب أن يتخذها {actor} أولا لتحسين {concept} في {title} {goal}",
         "ما الخطوة التي يجب أن يتخذها {actor} أولا لتحسين {concept} في {title} {goal}"),
        ("أي إجراء يمكّن {actor} من تأمين {concept} ضمن {title} {goal}",
         "ما الإجراء الذي يمكّن {actor} من تأمين {concept} ضمن {title} {goal}"),
        ("أي قرار بشأن {concept} في {title} يجب أن يتخذه {actor} {goal}",
         "ما القرار الذي يجب أن يتخذه {actor} بشأن {concept} في {title} {goal}"),
        ("أي مؤشر يجب أن يراقبه {actor} من أجل {concept} في {title} {goal}",
         "ما المؤشر الذي يجب أن يراقبه {actor} من أجل {concept} في {title} {goal}"),
        ("أي معيار يساعد {actor} على تقييم {concept} في {title} {goal}",
         "ما المعيار الذي يساعد {actor} على تقييم {concept} في {title} {goal}"),
        ("أي ضمانة يجب أن يضيفها {actor} إلى {concept} في {title} {goal}",
         "ما الضمانة التي يجب أن يضيفها {actor} إلى {concept} في {title} {goal}"),
    ),
    concepts=(("تخطيط السعة", "التنبؤ بالسعة"), ("التحكم في الوصول", "إدارة الأذونات"),
              ("سجلات التدقيق", "سجلات النشاط"), ("تدوير النسخ الاحتياطية", "تناوب اللقطات"),
              ("تدوير الأسرار", "تجديد بيانات الاعتماد"), ("فحوصات السلامة", "فحوصات الجاهزية"),
              ("توجيه حركة المرور", "توزيع الطلبات")),
    scenarios=(
        ("أثناء تدقيق امتثال ربع سنوي", "بينما تجري مراجعة امتثال ربع سنوية"),
        ("بعد أن تصل حركة المرور إلى 12000 طلب في الثانية",
         "عقب ارتفاع مفاجئ إلى 12000 طلب في الثانية"),
        ("قبل إطلاق منتج رئيسي", "قبيل إصدار كبير"),
        ("خلال نافذة صيانة ليلية مدتها 4 ساعات", "في فترة صيانة مجدولة مدتها 4 ساعات ليلا"),
        ("بعد أن كشفت مراجعة أمنية عن ثغرة", "عندما وجد فحص أمني داخلي نقطة ضعف"),
        ("عندما لا تتحقق أهداف زمن الاستجابة لمدة 7 أيام",
         "بعد 7 أيام من تفويت أهداف زمن الاستجابة"),
        ("أثناء تمرين التعافي من الكوارث", "خلال التدرب على التعافي من انقطاع كبير")),
    actors=(("المشغل", "مشغل النظام"), ("مهندس المنصة", "مهندس البنية التحتية"),
            ("المطور المناوب", "المبرمج المناوب"), ("المراجع الأمني", "مدقق الأمن"),
            ("قائد المشروع", "قائد الفريق"), ("مهندس الحلول", "مصمم النظام"),
            ("مهندس البيانات", "مهندس خطوط البيانات")),
    goals=(("لإبقاء التكاليف متوقعة", "بحيث تبقى النفقات قابلة للتنبؤ"),
           ("لتقليل خطر فقدان البيانات", "بحيث يمكن فقدان بيانات أقل"),
           ("لتقصير زمن التعافي", "بحيث يستغرق التعافي وقتا أقل"),
           ("لتجنب المفاجآت في بيئة الإنتاج", "بحيث لا يحدث شيء غير متوقع في الإنتاج"),
           ("لتوضيح الملكية", "بحيث يعرف الجميع من يملك ماذا"),
           ("لاكتشاف المشكلات مبكرا", "بحيث تلاحظ المشكلات أسرع"),
           ("لتقليل العمل اليدوي", "بحيث ينجز عمل أقل باليد")),
    good=("حدد مالكا واضحا وراجع الإعداد وفق جدول ثابت",
          "أتمت الفحص وأطلق تنبيها عند الانحراف عن خط الأساس",
          "ابدأ بتجربة صغيرة وقس أثرها قبل التوسع",
          "طبق التغيير على مراحل مع خطة تراجع مختبرة",
          "اقصر الوصول على من يحتاجه وسجل كل استخدام",
          "تدرب على مسار التعافي بانتظام وقس زمنه"),
    bad=("انتظر حتى يشتكي المستخدمون قبل فعل أي شيء",
         "طبق التغيير في كل مكان دفعة واحدة دون اختبار",
         "اعتمد على ذاكرة مهندس كبير واحد",
         "عطل التنبيهات المرتبطة لتقليل الضجيج",
         "امنح الجميع صلاحيات المدير لتجنب التأخير",
         "احفظ بيانات الاعتماد في جدول بيانات مشترك"),
    explanation="«{correct}» يبقي {concept} تحت السيطرة؛ أما الطرق الأخرى فتتركه للصدفة أو "
                "تزيد المخاطر.",
    question_mark="؟", comma="،", part="(الجزء {n})", digits="٠١٢٣٤٥٦٧٨٩",
    retype={"أ": "ا", "إ": "ا"},
)

RU = Corpus(
    stems=(
        ("Какой способ лучше всего подходит {actor} для работы с {concept} в {title} {goal}",
         "Как {actor} лучше всего управлять {concept} в {title} {goal}"),
        ("Какой шаг {actor} следует сделать первым в работе над {concept} в {title} {goal}",
         "Что {actor} нужно сделать прежде всего в работе над {concept} в {title} {goal}"),
        ("Какая мера позволит {actor} надёжно управлять {concept} в {title} {goal}",
         "Что позволит {actor} безопасно распоряжаться {concept} в {title} {goal}"),
        ("Какое решение в связи с {concept} в {title} нужно принять {actor} {goal}",
         "Что {actor} нужно решить в связи с {concept} в {title} {goal}"),
        ("За каким сигналом {actor} следует следить, занимаясь {concept} в {title} {goal}",
         "Какой сигнал {actor} нужно отслеживать, занимаясь {concept} в {title} {goal}"),
        ("Какой критерий поможет {actor} судить о работе с {concept} в {title} {goal}",
         "По какому критерию {actor} судить о работе с {concept} в {title} {goal}"),
        ("Какую защитную меру {actor} следует добавить при работе с {concept} в {title} {goal}",
         "Какую страховку {actor} нужно предусмотреть при работе с {concept} в {title} {goal}"),
    ),
    concepts=(("планированием мощностей", "прогнозированием мощностей"),
              ("контролем доступа", "управлением разрешениями"),
              ("журналами аудита", "журналами действий"),
              ("ротацией резервных копий", "сменой снимков"),
              ("ротацией секретов", "обновлением учётных данных"),
              ("проверками работоспособности", "проверками живости"),
              ("маршрутизацией трафика", "распределением запросов")),
    scenarios=(
        ("во время ежеквартального аудита соответствия",
         "пока идёт ежеквартальная проверка соответствия"),
        ("после роста трафика до 12000 запросов в секунду",
         "после внезапного скачка до 12000 запросов в секунду"),
        ("перед запуском крупного продукта", "накануне большого релиза"),
        ("в 4-часовое ночное окно обслуживания", "в плановое ночное окно работ на 4 часа"),
        ("после того как проверка безопасности нашла уязвимость",
         "когда внутренний аудит безопасности выявил слабое место"),
        ("когда цели по задержке не выполняются 7 дней",
         "после 7 дней невыполненных целей по времени ответа"),
        ("во время учений по аварийному восстановлению",
         "в ходе тренировки восстановления после крупного сбоя")),
    actors=(("оператору", "системному оператору"), ("инженеру платформы", "инженеру инфраструктуры"),
            ("дежурному разработчику", "разработчику на дежурстве"),
            ("специалисту по безопасности", "аудитору безопасности"),
            ("руководителю проекта", "руководителю команды"),
            ("архитектору решений", "проектировщику системы"),
            ("инженеру данных", "инженеру конвейеров данных")),
    goals=((", чтобы расходы оставались предсказуемыми", ", так, чтобы затраты были предсказуемы"),
           (", чтобы снизить риск потери данных", ", так, чтобы можно было потерять меньше данных"),
           (", чтобы сократить время восстановления",
            ", так, чтобы восстановление занимало меньше времени"),
           (", чтобы избежать сюрпризов в продакшене",
            ", так, чтобы в продакшене не было неожиданностей"),
           (", чтобы сделать ответственность явной", ", так, чтобы все знали, кто за что отвечает"),
           (", чтобы раньше обнаруживать проблемы", ", так, чтобы проблемы замечались быстрее"),
           (", чтобы сократить ручной труд", ", так, чтобы меньше работы делалось вручную")),
    good=("Назначить явного владельца и пересматривать настройку по графику",
          "Автоматизировать проверку и оповещать при отклонении от базовой линии",
          "Начать с небольшого пилота и измерить эффект перед расширением",
          "Выкатывать изменение поэтапно с проверенным планом отката",
          "Ограничить доступ теми, кому он нужен, и журналировать каждое использование",
          "Регулярно репетировать восстановление и засекать его время"),
    bad=("Ничего не делать, пока пользователи не пожалуются",
         "Применить изменение везде сразу без тестирования",
         "Полагаться на память одного старшего инженера",
         "Отключить связанные оповещения, чтобы было меньше шума",
         "Выдать всем права администратора, чтобы избежать задержек",
         "Хранить учётные данные в общей таблице"),
    explanation="«{correct}» держит под контролем ситуацию с {concept}; остальные способы "
                "оставляют её на волю случая или добавляют риск.",
    question_mark="?", comma=",", part="(часть {n})", digits="",
    retype={"ё": "е"},
)

CORPORA: dict[str, Corpus] = {"fa": FA, "ar": AR, "ru": RU}
GOOD: frozenset[str] = frozenset(g for c in CORPORA.values() for g in c.good)


@dataclass(frozen=True)
class _Style:
    what_form: bool = False
    scenario_first: bool = False
    concept_alt: bool = False
    actor_alt: bool = False
    goal_alt: bool = False
    scenario_alt: bool = False
    digits: bool = False  # numbers in the language's digits (Russian: regrouped)
    retyped: bool = False  # the letters a writer of the language may type for the corpus's


def _slots(key: str, serial: int) -> tuple[int, int, int, int, int, int]:
    """(stem, concept, scenario, actor, goal, part) of question ``serial`` of a chapter."""
    index = max(serial, 1) - 1
    part, index = divmod(index, P * P)
    rng = _rng("corpus-banks", key, part)
    multiplier = rng.randrange(1, P) * P + rng.randrange(1, P)
    orders = [rng.sample(range(P), P) for _ in range(5)]
    row = (multiplier * index + rng.randrange(P * P)) % (P * P)
    a, b = divmod(row, P)
    return (orders[0][a], orders[1][b], orders[2][(a + b) % P], orders[3][(a + 2 * b) % P],
            orders[4][(a + 3 * b) % P], part)


def _base(serial: int) -> _Style:
    return _Style(what_form=serial % 3 == 0, scenario_first=serial % 4 == 1,
                  goal_alt=serial * 7 % 5 < 2, scenario_alt=serial * 3 % 7 < 3)


def _digits(text: str, corpus: Corpus) -> str:
    if corpus.digits:
        return text.translate(str.maketrans("0123456789", corpus.digits))
    return re.sub(r"\b(\d{1,3})(\d{3})\b", r"\1 \2", text)  # 12000 -> 12 000


def _render(corpus: Corpus, key: str, serial: int, style: _Style, title: str) -> str:
    stem, concept, scenario, actor, goal, part = _slots(key, serial)
    template = corpus.stems[stem][1 if style.what_form else 0]
    body = template.format(actor=corpus.actors[actor][style.actor_alt],
                           concept=corpus.concepts[concept][style.concept_alt],
                           title=title, goal=corpus.goals[goal][style.goal_alt])
    where = corpus.scenarios[scenario][style.scenario_alt]
    if style.scenario_first:
        text = f"{where[0].upper()}{where[1:]}{corpus.comma} {body[0].lower()}{body[1:]}"
    else:
        text = f"{body} {where}"
    text = text.replace(" ,", ",") + corpus.question_mark  # Russian goals start with a comma
    if style.digits:
        text = _digits(text, corpus)
    if style.retyped:
        text = text.translate(str.maketrans(corpus.retype))
    if part:
        text = f"{text} {corpus.part.format(n=_digits(str(part + 1), corpus))}"
    return text


def _question(corpus: Corpus, key: str, title: str, serial: int, style: _Style,
              answer_position: int | None) -> dict[str, Any]:
    rng = _rng("corpus-choices", key, serial)
    correct = rng.choice(corpus.good)
    choices = rng.sample(corpus.bad, ANSWER_SLOTS - 1)
    index = answer_index(serial, answer_position)
    choices.insert(index, correct)
    concept = corpus.concepts[_slots(key, serial)[1]][0]
    return {"question": _render(corpus, key, serial, style, title), "choices": choices,
            "answer_index": index,
            "explanation": corpus.explanation.format(correct=correct, concept=concept)}


def make_question(language: str, key: str, title: str, serial: int,
                  answer_position: int | None = None) -> dict[str, Any]:
    """Question ``serial`` of a chapter written in ``language`` (fa, ar or ru)."""
    return _question(CORPORA[language], key, title, serial, _base(serial), answer_position)


_CHANGES = ("what_form", "scenario_first", "concept_alt", "actor_alt", "goal_alt",
            "scenario_alt", "digits", "retyped")


def reword(language: str, key: str, title: str, serial: int, variant: int,
           answer_position: int | None = None) -> dict[str, Any]:
    """A paraphrase of question ``serial``: one or two of its surface forms flipped (one
    synonym at most, as mockllm.questions.reword_changes keeps them; never a change that
    leaves the text as it was, such as other digits in a question without numbers), same
    choices and answer."""
    corpus = CORPORA[language]
    original = _base(serial)
    before = _render(corpus, key, serial, original, title)
    synonyms = {"concept_alt", "actor_alt", "goal_alt", "scenario_alt"}
    rng = _rng("corpus-reword", key, serial, variant)
    style = replace(original, what_form=not original.what_form)
    for _ in range(20):
        changes = rng.sample(_CHANGES, rng.choice((1, 2, 2)))
        if len(synonyms.intersection(changes)) > 1:
            continue
        candidate = original
        for change in changes:
            candidate = replace(candidate, **{change: not getattr(candidate, change)})
        if _render(corpus, key, serial, candidate, title) != before:
            style = candidate
            break
    return _question(corpus, key, title, serial, style, answer_position)
