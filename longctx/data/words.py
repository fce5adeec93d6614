"""Word lists shared by the synthetic training corpus and the eval suite: RULER-style
adjective-noun keys ("words" needles) and single words (common-words extraction).

One list for both, so that the keys a model is trained to match are drawn the way the
eval draws its keys (a random pair from the same lists), never that the eval reuses a
training document: values and pairings are random per sample.
"""

ADJECTIVES = """
abandoned able absolute academic acceptable acidic active actual adorable adventurous afraid
aggressive agreeable alert alive amazing ancient angry annual anxious apparent arctic aromatic
artistic ashamed average awake awful bad bare basic beautiful better big bitter bland blank
blue bold bouncy brave brief bright brilliant broad broken brown bumpy busy calm capable careful
cautious central certain charming cheap cheerful chemical chilly chubby classic clean clever
cloudy clumsy coastal cold colorful common complete complex confused cool correct cosmic crazy
creative crisp crooked crowded cruel curious curly cute damp dark dear decent deep defiant
delicate delightful dense dependent desperate different digital direct dirty distant dizzy
domestic double dramatic dry dull dusty eager early earnest eastern easy elastic electric
elegant empty endless energetic enormous equal eternal even evil exact excellent exotic
expensive faint fair faithful false familiar famous fancy far fast fearless festive few fierce
filthy final fine firm flat flawless fluffy foolish formal fragile frail free fresh friendly
frozen full funny fuzzy gentle giant gifted glad global glossy golden good graceful grand
grateful great green grey grim gritty grumpy guilty handsome happy hard harmless hasty healthy
heavy helpful hidden high hollow honest hopeful horrible hot huge humble hungry icy ideal idle
illegal immense important impossible inner innocent intense internal jagged jolly juicy junior
keen kind large late lazy lean legal level light likely little lively lonely long loose loud
lovely loyal lucky lumpy mad magic main major mellow merry mild misty modern moist motionless
muddy narrow nasty natural neat nervous new nice nimble noble noisy normal numb obedient odd
old open orange ordinary organic other outer pale parallel past patient peaceful perfect plain
pleasant plump polite poor popular portable powerful precious pretty private proud pure purple
quick quiet quirky rapid rare raw ready real red regular remote rich rigid ripe rough round
royal rural rusty sad safe salty scary secret serious shallow sharp shiny short shy silent
silly simple single slim slow small smart smooth soft solid sour spare spicy square stable
steady steep sticky stiff strange strict strong sturdy subtle sudden sunny super sweet swift
tall tame tender tense thick thin thirsty tidy tiny tired tough tricky true twin ugly unique
upper urban useful vague valid vast velvet violet visible vivid warm wary weak wealthy weary
western wet white whole wide wild windy wise witty wooden worried young zany zealous
""".split()

NOUNS = """
account acorn actor advice airport album alley anchor angle animal answer apple arch area arm
army arrow artist attic aunt avenue baby badge bag bakery ball balloon banana band bank barn
basket bath battery beach bean bear bed bee bell belt bench berry bicycle bird blanket boat
body bone book boot border bottle box brain branch bread brick bridge brother brush bucket
building bull butter button cabin cable cactus cake camera camp canal candle canoe canvas
captain car card carpet carrot castle cat cave ceiling cellar chair chalk channel cheese cherry
chest chicken chimney church circle city clock cloud coach coast coat coffee coin college
comet copper corner cotton country cousin cow crab crayon creek crowd crown cup curtain cycle
dancer deer desert desk diamond dinner doctor dog doll dolphin door dragon drawer dream drum
duck eagle ear earth egg elbow engine envelope eye fabric face factory farm feather fence field
finger fire fish flag flame floor flower flute fog forest fork fountain fox frog fruit garage
garden gate ghost giraffe glass glove goat gold grape grass guitar hall hammer hand harbor hat
hawk heart helmet hill hobby honey horse hospital hotel house island jacket jar jewel journey
jungle kettle key kitchen kite knee knife ladder lake lamp lantern leaf lemon letter library
lion lizard lobster lock machine magnet map market meadow melon mirror monkey moon mountain
mouse museum needle nest net notebook ocean office onion orange orchard oven owl paint palace
panda paper parcel park parrot path peach pearl pencil pepper piano picture pillow pilot pine
planet plate pocket pond potato puzzle queen rabbit radio rain river road robot rock roof room
rope rose sail salad sand school scissors sea seed shadow sheep shell ship shoe shop shore
silver singer sister sky snake snow soap sock sofa spider spoon square stage star station
stone storm stove street string sugar summer sun swan table tail teacher temple tent theater
thread throne thunder ticket tiger toast tomato tool tower town toy tractor train tree truck
trumpet tunnel turtle umbrella valley vase village violin volcano wagon wall wallet watch
water whale wheel window wing winter wizard wolf wood yard zebra
""".split()

VERBS = """
accept admire allow answer appear argue arrive attach bake balance behave belong blink boil
borrow bounce breathe bring build calculate carry celebrate change chase check choose clap
climb collect compare complain connect consider cook copy count cover crawl cross dance decide
deliver describe design destroy develop disappear discover divide drag draw dream drift drink
drive earn educate embrace enjoy enter escape examine expand explain explore fasten fetch
finish float fold follow forget forgive gather glide grab greet grow guard guess hammer handle
hang happen harvest heal hover hunt hurry ignore imagine improve include inform inspect invent
invite jog juggle jump kneel knit knock laugh launch lead learn lift listen march marry measure
melt mend mix move notice obey observe offer open order organize paddle paint park pause
perform pick plan plant play polish pour practice praise pray predict prepare present print
promise protect pull punch push question race rain reach read recall receive recycle reflect
relax remember repair repeat reply rescue return ride rinse roll rub rush sail scatter scribble
search settle sew shake share shiver shout sing skate sketch skip sleep slide smile sneeze
snore solve sort sparkle speak spell spin splash spray sprint squeeze stack stare start steer
stir stretch study suggest supply surprise swim swing talk taste teach tease thank think
throw tickle touch trace trade train travel trust try tumble twist type unite unlock unpack
vanish visit wait walk wander want warn wash watch wave weave welcome whisper whistle wink
wish wobble wonder work worry wrap write yawn yell zoom
""".split()

# Adjective-noun keys/values, RULER's "words" needle type.
WORD_PAIRS = sorted({f"{a}-{n}" for a in ADJECTIVES for n in NOUNS})
# Single words for common-words extraction (cwe).
SINGLE_WORDS = sorted(set(ADJECTIVES) | set(NOUNS) | set(VERBS))
# the longest key (bounds document sizes)
LONGEST_PAIR = max(WORD_PAIRS, key=len)
