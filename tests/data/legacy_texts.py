"""Real text in the languages legacy encodings were made for, and which encoding holds which.

Each language has a short text (one line, the size of a title or a note: the hard case for a
detector) and a paragraph. CASES pairs each of the 20 encodings tested with the languages
written in it; the test_ingest_encodings.py table and docs/data.md's table come from it.
"""

from __future__ import annotations

TEXTS = {
    "French": (
        "Façade naïve : le garçon a mangé une crêpe à côté de l'église.\n",
        "La forêt était calme ; on n'entendait que la rivière. Où est la bibliothèque ? "
        "L'été dernier, nous étions très heureux à la campagne ; ça coûte cher, déjà.\n"
        "Les élèves ont répété leur leçon de géographie avant la fête de Noël, et le "
        "maître, ému, leur a offert des châtaignes grillées et du pain d'épice.\n",
    ),
    "French (cp1252 only)": (
        "« Ça coûte 12 € », dit-elle — l’œuvre était déjà vendue…\n",
        "Le cœur a ses raisons que la raison ne connaît point. « Où est la bibliothèque ? » "
        "demanda l’élève — personne ne répondit… L’été dernier, le billet coûtait 45 € ; "
        "aujourd’hui, c’est le double, et l’œuvre de Molière reste à l’affiche.\n",
    ),
    "German": (
        "Größere Übungen für Änderungen: Straße und Fußgänger.\n",
        "Größere Übungen für Änderungen: Straße, Fußgänger und Mädchen spielten draußen. "
        "Über die Brücke fährt täglich ein Zug nach München, und die Gäste genießen "
        "die Aussicht auf die schönen Berge. Die Bäckerei öffnet früh um fünf Uhr.\n",
    ),
    "Spanish": (
        "¿Dónde está el niño? ¡Mañana iremos a la montaña!\n",
        "¿Dónde está el niño? ¡Mañana iremos a la montaña con la señora García! El "
        "corazón tiene razones que la razón no entiende. Después de la lección, los "
        "alumnos comieron pequeños pasteles de almendra en el jardín del pueblo.\n",
    ),
    "Portuguese": (
        "A informação não está disponível; ação é necessária.\n",
        "A informação não está disponível neste momento, e a ação é necessária. Os "
        "irmãos viajaram para o Maranhão e comeram pão de queijo com café. Não há "
        "solução fácil: as crianças estão à espera da avó desde o começo da tarde.\n",
    ),
    "Polish": (
        "Zażółć gęślą jaźń; łódź płynie po rzece.\n",
        "Zażółć gęślą jaźń. Łódź płynie powoli po szerokiej rzece, a dzieci bawią się "
        "na brzegu. Wczoraj pojechaliśmy do Wrocławia, gdzie zjedliśmy pierogi i "
        "wypiliśmy gorącą herbatę z cytryną. Jutro będzie padał śnieg.\n",
    ),
    "Czech": (
        "Příliš žluťoučký kůň úpěl ďábelské ódy.\n",
        "Příliš žluťoučký kůň úpěl ďábelské ódy. Včera jsme šli na procházku do "
        "parku, kde si děti hrály na písku a babička četla knihu. Čeština má mnoho "
        "háčků a čárek, které mění výslovnost samohlásek i souhlásek.\n",
    ),
    "Turkish": (
        "Çocuklar bahçede oynuyor; öğretmen şöyle dedi.\n",
        "Çocuklar bahçede oynuyor ve öğretmen onlara şöyle dedi: yarın İstanbul'a "
        "gideceğiz. Ağaçların altında oturup çay içtik, güneş batarken ışıklar "
        "yandı. Türkçe öğrenmek zor değil, ama düzenli çalışmak gerekiyor.\n",
    ),
    "Russian": (
        "Привет, как дела? Это тестовый текст.\n",
        "Привет, как дела? Это тестовый текст на русском языке, довольно длинный. "
        "Вчера мы гуляли по парку, и дети кормили уток хлебом. Москва - большой город, "
        "где живёт много людей, и каждый день по улицам едут тысячи машин.\n",
    ),
    "Greek": (
        "Καλημέρα σας, τι κάνετε σήμερα;\n",
        "Καλημέρα σας, τι κάνετε σήμερα; Η Αθήνα είναι μια όμορφη πόλη με πολλά "
        "μνημεία και μουσεία. Χθες πήγαμε στη θάλασσα και φάγαμε ψάρια σε μια μικρή "
        "ταβέρνα δίπλα στο λιμάνι, ενώ ο ήλιος έδυε πίσω από τα βουνά.\n",
    ),
    "Hebrew": (
        "שלום, מה שלומך היום?\n",
        "שלום, מה שלומך היום? ירושלים היא עיר עתיקה ויפה עם היסטוריה ארוכה. אתמול "
        "הלכנו לשוק וקנינו פירות וירקות טריים, ואחר כך שתינו קפה בבית קפה קטן ליד "
        "הים. הילדים שיחקו בגן עד שהשמש שקעה.\n",
    ),
    "Arabic": (
        "مرحبا، كيف حالك اليوم؟\n",
        "مرحبا، كيف حالك اليوم؟ القاهرة مدينة كبيرة وجميلة على ضفاف نهر النيل. ذهبنا "
        "أمس إلى السوق واشترينا الخبز والفواكه، ثم شربنا الشاي في مقهى صغير قرب "
        "المسجد. الأطفال يلعبون في الحديقة حتى غروب الشمس.\n",
    ),
    "Chinese (simplified)": (
        "今天天气很好，我们去公园散步吧。\n",
        "今天天气很好，我们去公园散步吧。北京是中国的首都，有很多历史悠久的名胜古迹。"
        "昨天我和朋友一起去博物馆参观，看到了许多珍贵的文物。晚上我们在一家小饭馆吃了"
        "饺子和面条，大家都很高兴。\n",
    ),
    "Chinese (traditional)": (
        "今天天氣很好，我們去公園散步吧。\n",
        "今天天氣很好，我們去公園散步吧。臺北是一座熱鬧的城市，有很多美味的小吃。"
        "昨天我和朋友一起去博物館參觀，看到了許多珍貴的文物。晚上我們在夜市吃了"
        "牛肉麵和珍珠奶茶，大家都很開心。\n",
    ),
    "Japanese": (
        "日本語のテキストです。これはテストです。\n",
        "日本語のテキストです。東京は大きな都市で、たくさんの人が住んでいます。"
        "昨日は友達と一緒に公園へ行き、桜の花を見ながらお弁当を食べました。"
        "夜になると、駅の近くの小さな店でラーメンを食べてから家に帰りました。\n",
    ),
    "Korean": (
        "안녕하세요, 오늘 날씨가 좋네요.\n",
        "안녕하세요, 오늘 날씨가 정말 좋네요. 서울은 큰 도시이고 많은 사람들이 살고 "
        "있습니다. 어제는 친구와 함께 공원에 가서 산책을 하고 맛있는 김치찌개를 "
        "먹었습니다. 저녁에는 한강 근처에서 야경을 구경했습니다.\n",
    ),
}

UTF16_LE_BOM, UTF16_BE_BOM = b"\xff\xfe", b"\xfe\xff"

# (label, how to encode: a codec name, or (BOM, codec) for UTF-16 with an explicit mark,
#  languages)
CASES = [
    ("utf-8", "utf-8", ["French", "Russian", "Chinese (simplified)", "Arabic"]),
    ("utf-16-le + BOM", (UTF16_LE_BOM, "utf-16-le"), ["French", "Japanese"]),
    ("utf-16-be + BOM", (UTF16_BE_BOM, "utf-16-be"), ["Greek", "German"]),
    ("utf-16-le, no BOM", "utf-16-le", ["French", "German"]),
    ("utf-16-be, no BOM", "utf-16-be", ["German", "Spanish"]),
    ("latin-1", "latin-1", ["French", "German", "Spanish", "Portuguese"]),
    ("cp1252", "cp1252", ["French (cp1252 only)", "French", "German", "Spanish",
                          "Portuguese"]),
    ("cp1250", "cp1250", ["Polish", "Czech"]),
    ("cp1251", "cp1251", ["Russian"]),
    ("koi8-r", "koi8-r", ["Russian"]),
    ("iso-8859-7", "iso-8859-7", ["Greek"]),
    ("cp1253", "cp1253", ["Greek"]),
    ("iso-8859-9", "iso-8859-9", ["Turkish"]),
    ("cp1254", "cp1254", ["Turkish"]),
    ("cp1255", "cp1255", ["Hebrew"]),
    ("cp1256", "cp1256", ["Arabic"]),
    ("gb18030", "gb18030", ["Chinese (simplified)"]),
    ("shift_jis", "shift_jis", ["Japanese"]),
    ("euc-kr", "euc-kr", ["Korean"]),
    ("big5", "big5", ["Chinese (traditional)"]),
]


def encode(text: str, how) -> bytes:
    if isinstance(how, tuple):
        bom, codec = how
        return bom + text.encode(codec)
    return text.encode(how)


def samples():
    """(encoding label, language, size, text, bytes) for every case: size 'line' or 'paragraph'."""
    for label, how, languages in CASES:
        for language in languages:
            for size, text in zip(("line", "paragraph"), TEXTS[language]):
                yield label, language, size, text, encode(text, how)
