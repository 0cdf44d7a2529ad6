"""English text the tiny checkpoints' byte-level BPE tokenizer is trained on (offline, at build time).

Written for this project. It only has to give the BPE trainer enough common English words, chat
phrases, digits and punctuation that ordinary prompts tokenize into a few tokens per word; nothing
here is meant to be read by a model. Changing it changes every tiny checkpoint's vocabulary (and so
the bytes of its safetensors), so treat it as frozen.
"""

from __future__ import annotations

CORPUS: tuple[str, ...] = (
    "Hello! How are you doing today? I am doing well, thank you for asking.",
    "Hi there. What can I help you with this morning?",
    "Good afternoon. I would like to know what the weather will be like tomorrow.",
    "Tomorrow will be sunny in the morning, with a few clouds later in the afternoon.",
    "It might rain in the evening, so you may want to take an umbrella with you.",
    "Could you tell me a short story about a cat who lives in a library?",
    "Once upon a time, a small grey cat lived between the tall shelves of an old library.",
    "Every night she walked past the books and listened to the quiet sound of the pages.",
    "The children who came to read on Saturdays gave her a name: they called her Margo.",
    "What time is it right now? It is a quarter past ten in the morning.",
    "Please set a timer for five minutes. Sure, the timer is set for five minutes.",
    "Remind me to call my mother at six o'clock. I will remind you at six.",
    "How do I make a cup of tea? First boil some water, then pour it over the tea leaves.",
    "Let it steep for three or four minutes, then remove the leaves and add milk if you like.",
    "Can you recommend a good book to read on a long train journey?",
    "I think you would enjoy a mystery novel; they are easy to pick up and hard to put down.",
    "What is the capital of France? The capital of France is Paris.",
    "How far is the moon from the earth? On average it is about three hundred and eighty four thousand kilometers"
    " away.",
    "Why is the sky blue? Sunlight is scattered by the air, and blue light is scattered the most.",
    "Translate good morning into Spanish. In Spanish, good morning is buenos dias.",
    "I'm sorry, I didn't catch that. Could you say it again, a little more slowly?",
    "Of course. I said that the meeting has been moved from Tuesday to Thursday.",
    "Thanks a lot, that's very helpful. You're welcome! Is there anything else?",
    "Yes, one more thing: what should I cook for dinner tonight?",
    "You could make a simple pasta with tomatoes, garlic, olive oil and fresh basil.",
    "That sounds delicious. How long does it take? About twenty minutes from start to finish.",
    "Numbers: one, two, three, four, five, six, seven, eight, nine, ten, eleven, twelve.",
    "Digits: 0 1 2 3 4 5 6 7 8 9 10 12 15 20 25 30 50 100 2024 2025 3.14 99%.",
    "Days of the week are Monday, Tuesday, Wednesday, Thursday, Friday, Saturday and Sunday.",
    "The months are January, February, March, April, May, June, July, August, September, October, November and"
    " December.",
    "Let's play a game. I'm thinking of an animal that lives in the ocean and sings songs.",
    "Is it a whale? Yes, it is a whale! You guessed it on your first try.",
    "Explain how a bicycle works in simple words.",
    "When you push the pedals, a chain turns the back wheel, and the bicycle moves forward.",
    "The brakes press against the wheels, and the handlebars let you steer left or right.",
    "What's the difference between weather and climate?",
    "Weather is what happens outside today; climate is the pattern of weather over many years.",
    "I feel a bit tired today. Maybe you could take a short walk or drink a glass of water.",
    "Getting enough sleep, eating well and moving a little every day usually helps.",
    "Can you speak more quietly? Sure, I will keep my voice soft and calm.",
    "Please stop. Okay, I have stopped. Let me know when you want me to continue.",
    "Where is the nearest train station? Walk two blocks north and turn right at the bakery.",
    "The station is across the street from the park, next to the big clock tower.",
    "How much is a ticket to the city center? A single ticket costs three euros and fifty cents.",
    "My favorite colors are red, orange, yellow, green, blue and purple.",
    "Music can make people happy, and many people like to sing while they work.",
    "The garden behind the house has roses, apple trees and a small pond with fish.",
    "In spring the birds come back, and in autumn the leaves turn brown and fall.",
    "I'm an assistant that can listen and talk. I try to answer clearly and briefly.",
    "If I don't know something, I will say so instead of making something up.",
    "Could you summarize that in one sentence? In short: the plan is ready and starts on Monday.",
    "Speak to me like a friend. Of course! It's good to hear from you; how was your day?",
    "My day was long but good. I finished a project at work and then went for a run.",
    "That's great to hear. Running after work is a nice way to clear your head.",
    "Can you hear me? Yes, I can hear you clearly. Your voice sounds fine.",
    "There's some noise in the background, but I can still understand what you are saying.",
    "Goodbye for now. Bye! Have a wonderful evening, and talk to you soon.",
)
"""Sentences, one per entry; the trainer sees them in this order."""
